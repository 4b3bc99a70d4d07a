"""Batch decode (pure): a batch of records -> log rows per table, and dead letters.

A batch is Arrow columns (`RecordBatch`). The common Debezium shape (a plain envelope with
ops c/u/d/r, a PostgreSQL `source` with `table` and `lsn`, a record key, an after-image of
scalars) is parsed per topic by Arrow's JSON reader and turned into log rows with Arrow
kernels, so such a record costs no Python objects. Everything else goes through
`Decoder.decode`, one record at a time, in log order: tombstones, schema envelopes, other
connectors, `key_fields` tables, integral floats (Arrow cannot tell `5` from `5.0`),
strings with control characters, anything malformed. Both routes give the same rows
(tests/connector/test_batch.py compares them on generated batches); the Arrow route's
after-image leaves null columns out, which reads the same.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Mapping

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from connector.debezium import Decoder, _key_text, _source_table
from connector.errors import DecodeError
from connector.ordering import SNAPSHOT_MARKERS
from connector.records import ChangeEvent, DeadLetter, SourceRecord
from iceberg.layouts import DEAD_LETTER_SCHEMA, LOG_SCHEMA, UTC_TS

# A source's records as columns: the log's own types, the key as the raw bytes.
RECORD_SCHEMA = pa.schema([pa.field("key", pa.binary()) if n == "key" else LOG_SCHEMA.field(n) for n in (
    "topic", "partition", "offset", "sequence_number", "enqueued_time", "key", "value", "headers")])
FAST_OPS = pa.array(["c", "u", "d", "r"])
_SPARK_TYPES = {pa.int64(): "bigint", pa.float64(): "double", pa.bool_(): "boolean", pa.string(): "string"}
_SCALARS = (pa.int64(), pa.float64(), pa.bool_(), pa.string(), pa.null())
_NULL_TEXT = pa.scalar(None, pa.string())


def _headers(r: SourceRecord) -> str | None:
    if not r.headers:
        return None
    return orjson.dumps({k: (v.decode("utf-8", "replace") if v is not None else None) for k, v in r.headers}).decode()


def streams_of(table: pa.Table) -> pa.Array:
    """`topic:partition` per row (see `records.stream_id`)."""
    return pc.binary_join_element_wise(table["topic"], table["partition"].cast(pa.string()), ":").combine_chunks()


def at_or_after(table: pa.Table, floors: Mapping[str, int]) -> pa.Array:
    """Per row: its sequence number is at or after its stream's floor (0 if not in `floors`)."""
    streams = streams_of(table)
    distinct = pc.unique(streams)
    floor = pa.array([floors.get(s, 0) for s in distinct.to_pylist()], pa.int64()).take(pc.index_in(streams, distinct))
    return pc.greater_equal(table["sequence_number"], floor)


class RecordBatch:
    """Records as Arrow columns (`RECORD_SCHEMA`, headers as JSON text); row i is record i.
    Sources that deliver `SourceRecord`s are wrapped with `of`; `records` materialises rows
    only where a record object is needed (the per-record decoder, dead letters)."""

    def __init__(self, table: pa.Table, records: list[SourceRecord] | None = None):
        self.table, self._records = table, records

    @classmethod
    def of(cls, records: list[SourceRecord]) -> "RecordBatch":
        columns = {
            "topic": [r.topic for r in records],
            "partition": [r.partition for r in records],
            "offset": [r.offset for r in records],
            "sequence_number": [r.sequence_number for r in records],
            "enqueued_time": [r.enqueued_time for r in records],
            "key": [r.key for r in records],
            "value": [r.value for r in records],
            "headers": [_headers(r) for r in records],
        }
        arrays = [pa.array(columns[f.name], f.type) for f in RECORD_SCHEMA]
        return cls(pa.Table.from_arrays(arrays, schema=RECORD_SCHEMA), records)

    def __len__(self) -> int:
        return self.table.num_rows

    @cached_property
    def streams(self) -> pa.Array:
        return streams_of(self.table)

    @cached_property
    def nbytes(self) -> pa.Array:
        """Key + value bytes per record, what quotas count (`SourceRecord.nbytes`)."""
        return pc.add(pc.binary_length(self.table["key"]).fill_null(0),
                      pc.binary_length(self.table["value"]).fill_null(0)).cast(pa.int64()).combine_chunks()

    def records(self, idx: list[int]) -> list[SourceRecord]:
        if self._records is not None:
            return [self._records[i] for i in idx]
        rows = self.table.take(pa.array(idx, pa.int64()))
        cols = {n: rows[n].to_pylist() for n in RECORD_SCHEMA.names}
        return [SourceRecord(t, p, o, q, e, k, v, _header_pairs(h))
                for t, p, o, q, e, k, v, h in zip(*(cols[n] for n in RECORD_SCHEMA.names))]

    def positions(self) -> dict[str, int]:
        """Per stream, the next sequence number after this batch."""
        if not len(self):
            return {}
        top = pa.table({"s": self.streams, "q": self.table["sequence_number"]}).group_by("s").aggregate([("q", "max")])
        return {s: q + 1 for s, q in zip(top["s"].to_pylist(), top["q_max"].to_pylist())}


def _header_pairs(text: str | None) -> tuple[tuple[str, bytes | None], ...]:
    if not text:
        return ()
    return tuple((k, v.encode() if v is not None else None) for k, v in orjson.loads(text).items())


@dataclass
class Rows:
    """Log rows of one table, and the batch rows (`idx`) they came from."""

    table: pa.Table
    idx: pa.Array

    def keep(self, mask: pa.Array) -> "Rows":
        return Rows(self.table.filter(mask), self.idx.filter(mask))

    @staticmethod
    def concat(parts: list["Rows"]) -> "Rows":
        return Rows(pa.concat_tables([p.table for p in parts]), pa.concat_arrays([p.idx for p in parts]))


@dataclass
class Decoded:
    events: dict[str, list[Rows]] = field(default_factory=lambda: defaultdict(list))
    letters: dict[str, list[DeadLetter]] = field(default_factory=lambda: defaultdict(list))


def _types_json(types: dict[str, str], memo: dict[int, tuple[dict, str]]) -> str:
    """Serialised once per types object (the decoder shares one per schema signature)."""
    hit = memo.get(id(types))
    if hit is None or hit[0] is not types:
        hit = memo[id(types)] = (types, orjson.dumps(types, option=orjson.OPT_SORT_KEYS).decode())
    return hit[1]


def _with_record_columns(batch: RecordBatch, idx: pa.Array, columns: dict[str, pa.Array], now: datetime) -> pa.Table:
    """Log rows: the batch's own columns for rows `idx`, plus the decoded `columns`."""
    rows = batch.table.take(idx)
    own = {n: rows[n] for n in ("topic", "partition", "offset", "sequence_number", "enqueued_time", "value", "headers")}
    own["payload_bytes"] = batch.nbytes.take(idx)
    own["ingested_at"] = pa.repeat(pa.scalar(now, UTC_TS), len(idx))
    merged = {**own, **columns}
    return pa.Table.from_arrays([merged[n] for n in LOG_SCHEMA.names], schema=LOG_SCHEMA)


def log_rows(events: list[ChangeEvent], now: datetime) -> pa.Table:
    memo: dict[int, tuple[dict, str]] = {}
    return _with_record_columns(RecordBatch.of([e.record for e in events]), pa.array(range(len(events)), pa.int64()), {
        "key": pa.array([e.key for e in events], pa.string()),
        "op": pa.array([e.op for e in events], pa.string()),
        "snapshot": pa.array([e.snapshot for e in events], pa.bool_()),
        "tombstone": pa.array([e.tombstone for e in events], pa.bool_()),
        "source_position": pa.array([list(e.position) if e.position is not None else None for e in events],
                                    pa.list_(pa.int64())),
        "source_ts_ms": pa.array([e.source_ts_ms for e in events], pa.int64()),
        "after": pa.array([orjson.dumps(e.after).decode() if e.after is not None else None for e in events],
                          pa.string()),
        "after_types": pa.array([_types_json(e.after_types, memo) if e.after_types else None for e in events],
                                pa.string()),
    }, now)


def dead_letter_rows(letters: list[DeadLetter], now: datetime) -> pa.Table:
    own = RecordBatch.of([d.record for d in letters]).table
    columns = {n: own[n] for n in ("topic", "partition", "offset", "sequence_number", "enqueued_time", "key", "value")}
    columns["reason"] = pa.array([d.reason for d in letters], pa.string())
    columns["detail"] = pa.array([d.detail for d in letters], pa.string())
    columns["ingested_at"] = pa.repeat(pa.scalar(now, UTC_TS), len(letters))
    return pa.Table.from_arrays([columns[n] for n in DEAD_LETTER_SCHEMA.names], schema=DEAD_LETTER_SCHEMA)


def _json_objects(values: pa.Array) -> pa.Array:
    """Per value: it may be one JSON object on one line (what `_parse` takes)."""
    objects = pc.starts_with(values, "{").fill_null(False)
    if not _line_breaks(values):
        return objects
    line_break = pc.or_(pc.match_substring(values, "\n"), pc.match_substring(values, "\r"))
    return pc.and_(objects, pc.invert(line_break.fill_null(False)))


def _line_breaks(values: pa.Array) -> bool:
    """Whether the array's data buffer holds a line break anywhere. Usually not, and then the
    per-value search is skipped (on a 200k-record batch: 0.01 - 0.03 s for this, ~0.05 s a
    search for it)."""
    data = values.buffers()[2]
    if data is None:
        return False
    raw = data.to_pybytes()
    return b"\n" in raw or b"\r" in raw


def _mask(n: int, idx: pa.Array) -> pa.Array:
    """A length-n mask, true at the positions `idx`."""
    return pc.scatter(pa.repeat(pa.scalar(True), len(idx)), idx.cast(pa.int64()), max_index=n - 1).fill_null(False)


def decode_batch(decoder: Decoder, batch: RecordBatch, now: datetime) -> Decoded:
    """Log rows per table and dead letters, exactly as `decoder.decode` would give them in
    log order (the decoder's topic -> table map is learned in that order too)."""
    out = Decoded()
    candidate = _json_objects(batch.table["value"].combine_chunks())
    topics = batch.table["topic"].combine_chunks()
    taken: list[pa.Array] = []
    learned: list[tuple[int, str, str]] = []
    for topic in pc.unique(topics.filter(candidate)).to_pylist():
        idx = pc.indices_nonzero(pc.and_(candidate, pc.equal(topics, topic))).cast(pa.int64())
        for table, rows in _fast_topic(decoder, batch, idx, now).items():
            out.events[table].append(rows)
            taken.append(rows.idx)
            learned.append((rows.idx[0].as_py(), topic, table))
    for table, rows in _bare_tombstones(decoder, batch, topics, now).items():
        out.events[table].append(rows)
        taken.append(rows.idx)
    fast = _mask(len(batch), pa.concat_arrays(taken)) if taken else pa.repeat(pa.scalar(False), len(batch))
    learned.sort()
    slow_idx = pc.indices_nonzero(pc.invert(fast)).to_pylist()
    slow: dict[str, list[tuple[int, ChangeEvent]]] = defaultdict(list)
    n = 0
    for i, record in zip(slow_idx, batch.records(slow_idx)):
        while n < len(learned) and learned[n][0] < i:
            decoder.learn(learned[n][1], learned[n][2])
            n += 1
        result = decoder.decode(record)
        if isinstance(result, DeadLetter):
            out.letters[result.table].append(result)
        else:
            slow[result.table].append((i, result))
    for _, topic, table in learned[n:]:
        decoder.learn(topic, table)
    for table, pairs in slow.items():
        rows = log_rows([e for _, e in pairs], now)
        out.events[table].append(Rows(rows, pa.array([i for i, _ in pairs], pa.int64())))
    return out


def _bare_tombstones(decoder: Decoder, batch: RecordBatch, topics: pa.Array, now: datetime) -> dict[str, Rows]:
    """Null-value records with a key, of topics whose table the decoder knew before this
    batch (so their route cannot change within it)."""
    known = decoder.topic_tables()
    if not known:
        return {}
    bare = pc.indices_nonzero(pc.is_null(batch.table["value"].combine_chunks())).cast(pa.int64())
    tables = _mapped(topics.take(bare), known.get)
    keys = _key_texts(batch.table["key"].take(bare).combine_chunks())
    ok = pc.and_(pc.is_valid(keys), pc.is_valid(tables))
    out: dict[str, Rows] = {}
    for table in pc.unique(tables.filter(ok)).to_pylist():
        mask = pc.and_(ok, pc.equal(tables, table))
        idx = bare.filter(mask)
        n = len(idx)
        out[table] = Rows(_with_record_columns(batch, idx, {
            "key": keys.filter(mask), "op": pa.repeat(pa.scalar("d"), n), "snapshot": pa.repeat(pa.scalar(False), n),
            "tombstone": pa.repeat(pa.scalar(True), n), "source_position": pa.nulls(n, pa.list_(pa.int64())),
            "source_ts_ms": pa.nulls(n, pa.int64()), "after": pa.nulls(n, pa.string()),
            "after_types": pa.nulls(n, pa.string())}, now), idx)
    return out


def _parse(values: pa.Array) -> pa.Table | None:
    """One row per value (JSON objects without line breaks), or None when Arrow cannot
    read them all alike."""
    lines = pc.binary_join_element_wise(values, b"", b"\n")  # each value + "\n", one buffer
    data = lines.buffers()[2][: pc.sum(pc.binary_length(lines)).as_py()]  # a fresh array starts at 0
    opts = pj.ReadOptions(block_size=max(1 << 20, 2 * pc.max(pc.binary_length(values)).as_py()))
    try:
        t = pj.read_json(pa.BufferReader(data), read_options=opts)
        if any(pa.types.is_timestamp(f.type) for f in _after_fields(t)):  # Arrow read ISO text as timestamps
            t = pj.read_json(pa.BufferReader(data), read_options=opts,
                             parse_options=pj.ParseOptions(explicit_schema=_no_timestamps(t.schema)))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return t if t.num_rows == len(values) else None


def _after_fields(t: pa.Table) -> list[pa.Field]:
    i = t.schema.get_field_index("after")
    return list(t.schema.field(i).type) if i >= 0 and pa.types.is_struct(t.schema.field(i).type) else []


def _no_timestamps(schema: pa.Schema) -> pa.Schema:
    def fix(t: pa.DataType) -> pa.DataType:
        if pa.types.is_timestamp(t):
            return pa.string()
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, fix(f.type)) for f in t])
        return t

    return pa.schema([pa.field(f.name, fix(f.type)) for f in schema])


def _column(parent: pa.Table | pa.StructArray, name: str, types: tuple[pa.DataType, ...]) -> pa.Array | None:
    """The named column cast to `types[0]` if its type is one of `types` (absent or all
    null: nulls), else None."""
    if isinstance(parent, pa.Table):
        i = parent.schema.get_field_index(name)
        col = parent.column(i).combine_chunks() if i >= 0 else None
    else:
        i = parent.type.get_field_index(name)
        col = pc.struct_field(parent, [i]) if i >= 0 else None
    if col is None:
        return pa.nulls(len(parent), types[0])
    if col.type == pa.null() or col.type in types:
        return col.cast(types[0])
    return None


def _fast_topic(decoder: Decoder, batch: RecordBatch, idx: pa.Array, now: datetime) -> dict[str, Rows]:
    """Rows per table for the records `idx` (one topic's) that the Arrow route can take;
    none if the values do not have the common shape."""
    t = _parse(batch.table["value"].take(idx).combine_chunks())
    if t is None or "payload" in t.schema.names or "op" not in t.schema.names:
        return {}
    n = t.num_rows
    op = _column(t, "op", (pa.string(),))
    source = t.column("source").combine_chunks() if "source" in t.schema.names else None
    after = t.column("after").combine_chunks() if "after" in t.schema.names else pa.nulls(n)
    if after.type == pa.null():
        after = pa.nulls(n, pa.struct([]))
    doc_ts = _column(t, "ts_ms", (pa.int64(),))
    if (op is None or doc_ts is None or source is None or not pa.types.is_struct(source.type)
            or any(f.type not in _SCALARS for f in source.type)
            or not pa.types.is_struct(after.type) or any(f.type not in _SCALARS for f in after.type)):
        return {}
    connector, lsn = _column(source, "connector", (pa.string(),)), _column(source, "lsn", (pa.int64(),))
    table_text, src_ts = _column(source, "table", (pa.string(),)), _column(source, "ts_ms", (pa.int64(),))
    marker = _column(source, "snapshot", (pa.string(), pa.bool_(), pa.int64()))
    if any(c is None for c in (connector, lsn, table_text, src_ts, marker)):
        return {}

    is_d = pc.equal(op, "d")
    after_text, types_text, bad = _after_json(after)
    keys = _key_texts(batch.table["key"].take(idx).combine_chunks())
    tables = _mapped(table_text, _table_or_none)
    ok = pc.and_kleene(pc.is_in(op, FAST_OPS), pc.is_valid(source))
    for cond in (pc.equal(pc.utf8_lower(connector), "postgresql"), pc.is_valid(lsn), pc.is_valid(tables),
                 pc.is_valid(keys), pc.or_(is_d, pc.is_valid(after)), pc.invert(bad),
                 pc.invert(pc.is_in(tables, pa.array(sorted(decoder.key_fields), pa.string())))):
        ok = pc.and_kleene(ok, cond)
    ok = ok.fill_null(False)
    if not pc.any(ok).as_py():
        return {}

    snapshot = pc.or_(pc.equal(op, "r"), pc.is_in(pc.utf8_lower(marker.cast(pa.string())),
                                                  pa.array(sorted(SNAPSHOT_MARKERS))).fill_null(False))
    columns = {
        "key": keys,
        "op": op,
        "snapshot": snapshot,
        "tombstone": pa.repeat(pa.scalar(False), n),
        "source_position": pa.ListArray.from_arrays(pa.array(range(n + 1), pa.int32()), lsn),
        "source_ts_ms": pc.if_else(pc.not_equal(src_ts.fill_null(0), 0), src_ts, doc_ts),
        "after": pc.if_else(is_d, _NULL_TEXT, after_text),
        "after_types": pc.if_else(is_d, _NULL_TEXT, types_text),
    }
    out: dict[str, Rows] = {}
    for table in pc.unique(tables.filter(ok)).to_pylist():
        mask = pc.and_(ok, pc.equal(tables, table))
        taken = idx.filter(mask)
        out[table] = Rows(_with_record_columns(batch, taken, {c: a.filter(mask) for c, a in columns.items()}, now),
                          taken)
    return out


# A key that is already its own canonical text: one field, an int or a printable ASCII string.
_CANONICAL_KEY = r'^\{"[A-Za-z_][A-Za-z0-9_]*":(0|-?[1-9][0-9]{0,17}|"[ !#-\[\]-~]*")\}$'


def _key_texts(keys: pa.Array) -> pa.Array:
    """`_key_text` of every key: keys already canonical as they are; JSON objects of non-null
    ints, strings and booleans as sorted compact JSON built by Arrow; any other key one
    distinct value at a time."""
    n = len(keys)
    ok = pc.match_substring_regex(keys, _CANONICAL_KEY).fill_null(False)
    texts = pc.replace_with_mask(pa.nulls(n, pa.string()), ok, keys.filter(ok).cast(pa.string()))
    cand = pc.and_(_json_objects(keys), pc.invert(ok))
    if pc.any(cand).as_py():
        idx = pc.indices_nonzero(cand)
        t = _parse(keys.filter(cand))
        if (t is not None and t.num_columns and "payload" not in t.schema.names
                and all(f.type in (pa.int64(), pa.string(), pa.bool_()) for f in t.schema)):
            struct = pa.StructArray.from_arrays([c.combine_chunks() for c in t.columns], names=t.schema.names)
            text, _, bad = _after_json(struct)
            good = pc.invert(bad)
            for c in t.columns:  # a null field is kept by the canonical form, left out by Arrow's
                good = pc.and_(good, pc.is_valid(c.combine_chunks()))
            parsed = _mask(n, idx.filter(good))
            texts = pc.replace_with_mask(texts, parsed, text.filter(good))
            ok = pc.or_(ok, parsed)
    rest = pc.invert(ok)
    if pc.any(rest).as_py():
        texts = pc.replace_with_mask(texts, rest, _mapped(keys.filter(rest), _key_text))
    return texts


def _mapped(values: pa.Array, fn) -> pa.Array:
    """`fn` applied once per distinct value (None for nulls) -> a string array, row for row."""
    distinct = pc.unique(values)
    images = pa.array([None if v is None else fn(v) for v in distinct.to_pylist()], pa.string())
    return images.take(pc.index_in(values, distinct))


def _table_or_none(text: str) -> str | None:
    try:
        return _source_table(text)
    except DecodeError:
        return None


def _after_json(after: pa.StructArray) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Per row: the after-image as JSON text (null columns left out), its types as JSON text
    with sorted keys (null when no column has a value), and whether the row must take the
    slow route (an integral float, a string with a control character)."""
    n = len(after)
    bad = pa.repeat(pa.scalar(False), n)
    values, types = [], []
    for i, f in sorted(enumerate(after.type), key=lambda x: x[1].name):
        if f.type == pa.null():
            continue
        col = pc.struct_field(after, [i])
        if f.type == pa.string():
            if pc.any(pc.match_substring_regex(col, r'[\x00-\x1f"\\]')).as_py():  # rare: escape
                bad = pc.or_kleene(bad, pc.match_substring_regex(col, r"[\x00-\x1f]").fill_null(False))
                col = pc.replace_substring(pc.replace_substring(col, "\\", "\\\\"), '"', '\\"')
            text = pc.binary_join_element_wise('"', col, '"', "")
        else:
            if f.type == pa.float64():
                bad = pc.or_kleene(bad, pc.equal(pc.floor(col), col).fill_null(False))
            text = col.cast(pa.string())
        name = orjson.dumps(f.name).decode()
        values.append(pc.binary_join_element_wise(name + ":", text, ",", "").fill_null(""))
        types.append(pc.if_else(pc.is_valid(col), f'{name}:"{_SPARK_TYPES[f.type]}",', ""))
    if not values:
        return pa.repeat(pa.scalar("{}"), n), pa.nulls(n, pa.string()), bad
    # Each fragment ends with a comma, the last one is cut. (Arrow 26's null_handling="skip"
    # returned fewer rows than it was given here, so nulls are emptied instead.)
    body = pc.utf8_slice_codeunits(pc.binary_join_element_wise(*values, ""), 0, -1)
    type_body = pc.utf8_slice_codeunits(pc.binary_join_element_wise(*types, ""), 0, -1)
    after_text = pc.binary_join_element_wise("{", body, "}", "")
    types_text = pc.if_else(pc.equal(type_body, ""), pa.scalar(None, pa.string()),
                            pc.binary_join_element_wise("{", type_body, "}", ""))
    return after_text, types_text, bad


__all__ = ["Decoded", "Rows", "dead_letter_rows", "decode_batch", "log_rows"]

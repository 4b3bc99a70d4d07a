"""Batch decode (pure): a batch of records -> log rows per table, and dead letters.

A batch is Arrow columns (`RecordBatch`). The common Debezium shape (a plain envelope with
ops c/u/d/r, a PostgreSQL `source` with `table` and `lsn`, a record key, an after-image of
scalars) is parsed per topic by Arrow's JSON reader and turned into log rows with Arrow
kernels (`connector.arrow_json`), so such a record costs no Python objects. Everything
else goes through `Decoder.decode`, one record at a time, in log order: tombstones, schema
envelopes, other connectors, `key_fields` tables, integral floats (Arrow cannot tell `5`
from `5.0`), strings with control characters, anything malformed. Both routes give the same rows
(tests/connector/test_batch.py compares them on generated batches); the Arrow route's
after-image leaves null columns out, which reads the same.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from connector.arrow_json import _NULL_TEXT, after_json, json_objects, key_texts, mapped, mask_at, parse
from connector.core.errors import DecodeError
from connector.core.ordering import SNAPSHOT_MARKERS
from connector.core.records import SOURCE_ERROR_HEADER, ChangeEvent, DeadLetter, SourceRecord
from connector.debezium import Decoder, _source_table
from connector.limits import RESERVED_COLUMNS
from iceberg.layouts import DEAD_LETTER_SCHEMA, HEADERS_TYPE, LOG_SCHEMA, UTC_TS

# A source's records as columns: the log's own types, the key as the raw bytes.
RECORD_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary())
        if n == "key"
        else pa.field("headers", HEADERS_TYPE)
        if n == "headers"
        else LOG_SCHEMA.field(n)
        for n in ("topic", "partition", "offset", "sequence_number", "enqueued_time", "key", "value", "headers")
    ]
)
FAST_OPS = pa.array(["c", "u", "d", "r"])
_SCALARS = (pa.int64(), pa.float64(), pa.bool_(), pa.string(), pa.null())


def _headers(r: SourceRecord) -> list[dict[str, Any]] | None:
    return [{"key": k, "value": v} for k, v in r.headers] if r.headers else None


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
    """Records as Arrow columns (`RECORD_SCHEMA`); row i is record i.
    Sources that deliver `SourceRecord`s are wrapped with `of`; `records` materialises rows
    only where a record object is needed (the per-record decoder, dead letters)."""

    def __init__(self, table: pa.Table, records: list[SourceRecord] | None = None):
        self.table, self._records = table, records

    @classmethod
    def of(cls, records: list[SourceRecord]) -> RecordBatch:
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
        return int(self.table.num_rows)

    @cached_property
    def nbytes(self) -> pa.Array:
        """Key + value bytes per record, what quotas count (`SourceRecord.nbytes`)."""
        return (
            pc.add(pc.binary_length(self.table["key"]).fill_null(0), pc.binary_length(self.table["value"]).fill_null(0))
            .cast(pa.int64())
            .combine_chunks()
        )

    def records(self, idx: list[int]) -> list[SourceRecord]:
        if self._records is not None:
            return [self._records[i] for i in idx]
        rows = self.table.take(pa.array(idx, pa.int64()))
        cols = {n: rows[n].to_pylist() for n in RECORD_SCHEMA.names}
        return [
            SourceRecord(t, p, o, q, e, k, v, _header_pairs(h))
            for t, p, o, q, e, k, v, h in zip(*(cols[n] for n in RECORD_SCHEMA.names))
        ]


def _first_header_is(headers: pa.Array, name: str) -> pa.Array:
    """Per record: its first header is `name` (how a source marks a record it could not read)."""
    return pa.array([bool(hs) and hs[0]["key"] == name for hs in headers.to_pylist()], pa.bool_())


def _header_pairs(headers: list[dict[str, Any]] | None) -> tuple[tuple[str, bytes | None], ...]:
    return tuple((h["key"], h["value"]) for h in headers) if headers else ()


@dataclass
class Rows:
    """Log rows of one table, and the batch rows (`idx`) they came from."""

    table: pa.Table
    idx: pa.Array

    def keep(self, mask: pa.Array) -> Rows:
        return Rows(self.table.filter(mask), self.idx.filter(mask))

    @staticmethod
    def concat(parts: list[Rows]) -> Rows:
        return Rows(pa.concat_tables([p.table for p in parts]), pa.concat_arrays([p.idx for p in parts]))


@dataclass
class Decoded:
    events: dict[str, list[Rows]] = field(default_factory=lambda: defaultdict(list))
    letters: dict[str, list[DeadLetter]] = field(default_factory=lambda: defaultdict(list))


def _types_json(types: dict[str, str], memo: dict[int, tuple[dict[str, str], str]]) -> str:
    """Serialised once per types object (the decoder shares one per schema signature)."""
    hit = memo.get(id(types))
    if hit is None or hit[0] is not types:
        hit = memo[id(types)] = (types, orjson.dumps(types, option=orjson.OPT_SORT_KEYS).decode())
    return hit[1]


def _take(data: pa.Table | pa.Array | pa.ChunkedArray, idx: pa.Array) -> Any:
    """`data.take(idx)` for ascending `idx`; a slice, without copying, when the rows are
    consecutive (a chunk of one topic's records, usually)."""
    if len(idx) and idx[-1].as_py() - idx[0].as_py() == len(idx) - 1:
        return data.slice(idx[0].as_py(), len(idx))
    return data.take(idx)


def _with_record_columns(batch: RecordBatch, idx: pa.Array, columns: dict[str, pa.Array], now: datetime) -> pa.Table:
    """Log rows: the batch's own columns for rows `idx` (ascending), plus the decoded `columns`."""
    rows = _take(batch.table, idx)
    own = {n: rows[n] for n in ("topic", "partition", "offset", "sequence_number", "enqueued_time", "value", "headers")}
    own["payload_bytes"] = _take(batch.nbytes, idx)
    own["ingested_at"] = pa.repeat(pa.scalar(now, UTC_TS), len(idx))
    merged = {**own, **columns}
    return pa.Table.from_arrays([merged[n] for n in LOG_SCHEMA.names], schema=LOG_SCHEMA)


def log_rows(events: list[ChangeEvent], now: datetime) -> pa.Table:
    memo: dict[int, tuple[dict[str, str], str]] = {}
    return _with_record_columns(
        RecordBatch.of([e.record for e in events]),
        pa.array(range(len(events)), pa.int64()),
        {
            "key": pa.array([e.key for e in events], pa.string()),
            "op": pa.array([e.op for e in events], pa.string()),
            "snapshot": pa.array([e.snapshot for e in events], pa.bool_()),
            "tombstone": pa.array([e.tombstone for e in events], pa.bool_()),
            "source_position": pa.array(
                [list(e.position) if e.position is not None else None for e in events], pa.list_(pa.int64())
            ),
            "source_ts_ms": pa.array([e.source_ts_ms for e in events], pa.int64()),
            "after": pa.array(
                [orjson.dumps(e.after).decode() if e.after is not None else None for e in events], pa.string()
            ),
            "after_types": pa.array(
                [_types_json(e.after_types, memo) if e.after_types else None for e in events], pa.string()
            ),
        },
        now,
    )


def dead_letter_rows(letters: list[DeadLetter], now: datetime) -> pa.Table:
    own = RecordBatch.of([d.record for d in letters]).table
    columns = {
        n: own[n]
        for n in ("topic", "partition", "offset", "sequence_number", "enqueued_time", "key", "value", "headers")
    }
    columns["reason"] = pa.array([d.reason for d in letters], pa.string())
    columns["detail"] = pa.array([d.detail for d in letters], pa.string())
    columns["ingested_at"] = pa.repeat(pa.scalar(now, UTC_TS), len(letters))
    return pa.Table.from_arrays([columns[n] for n in DEAD_LETTER_SCHEMA.names], schema=DEAD_LETTER_SCHEMA)


# Arrow's kernels release the GIL, so a big batch decodes in chunks on threads: 1M events
# ingested in 4.1 s against 4.9 s on one thread (2 cores, medians of five interleaved runs).
DECODE_THREADS = min(4, os.cpu_count() or 1)
DECODE_CHUNK = 20_000  # records; smaller chunks cost more in per-call overhead than threads save


def decode_batch(
    decoder: Decoder, batch: RecordBatch, now: datetime, chunk: int = DECODE_CHUNK, threads: int = DECODE_THREADS
) -> Decoded:
    """Log rows per table and dead letters, exactly as `decoder.decode` would give them in
    log order (the decoder's topic -> table map is learned in that order too). A topic's
    records take the Arrow route in chunks of at least `chunk`, on `DECODE_THREADS` threads."""
    out = Decoded()
    values = batch.table["value"].combine_chunks()
    candidate = pc.and_(
        json_objects(values, decoder.limits.max_depth),
        pc.less_equal(pc.binary_length(values), decoder.limits.max_value_bytes).fill_null(False),
    )
    headers = batch.table["headers"].combine_chunks()
    if headers.null_count < len(headers):  # a record a source could not read is a dead letter as it is
        unread = _first_header_is(headers, SOURCE_ERROR_HEADER)
        candidate = pc.and_(candidate, pc.invert(unread))
    topics = batch.table["topic"].combine_chunks()
    taken: list[pa.Array] = []
    learned: list[tuple[int, str, str]] = []
    work = []
    for topic in pc.unique(topics.filter(candidate)).to_pylist():
        idx = pc.indices_nonzero(pc.and_(candidate, pc.equal(topics, topic))).cast(pa.int64())
        step = max(chunk, -(-len(idx) // threads))
        work += [(topic, idx.slice(i, step)) for i in range(0, len(idx), step)]

    def fast(item: tuple[str, pa.Array]) -> dict[str, Rows]:
        return _fast_topic(decoder, batch, item[1], now)

    if len(work) > 1 and threads > 1:
        with ThreadPoolExecutor(threads, thread_name_prefix="decode") as pool:
            found = list(pool.map(fast, work))
    else:
        found = list(map(fast, work))
    for (topic, _), tables in zip(work, found):
        for table, rows in tables.items():
            out.events[table].append(rows)
            taken.append(rows.idx)
            learned.append((rows.idx[0].as_py(), topic, table))
    for table, rows in _bare_tombstones(decoder, batch, topics, now).items():
        out.events[table].append(rows)
        taken.append(rows.idx)
    fast = mask_at(len(batch), pa.concat_arrays(taken)) if taken else pa.repeat(pa.scalar(False), len(batch))
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
    tables = mapped(topics.take(bare), known.get)
    keys = key_texts(batch.table["key"].take(bare).combine_chunks(), decoder.key_format)
    ok = pc.and_(pc.is_valid(keys), pc.is_valid(tables))
    out: dict[str, Rows] = {}
    for table in pc.unique(tables.filter(ok)).to_pylist():
        mask = pc.and_(ok, pc.equal(tables, table))
        idx = bare.filter(mask)
        n = len(idx)
        out[table] = Rows(
            _with_record_columns(
                batch,
                idx,
                {
                    "key": keys.filter(mask),
                    "op": pa.repeat(pa.scalar("d"), n),
                    "snapshot": pa.repeat(pa.scalar(False), n),
                    "tombstone": pa.repeat(pa.scalar(True), n),
                    "source_position": pa.nulls(n, pa.list_(pa.int64())),
                    "source_ts_ms": pa.nulls(n, pa.int64()),
                    "after": pa.nulls(n, pa.string()),
                    "after_types": pa.nulls(n, pa.string()),
                },
                now,
            ),
            idx,
        )
    return out


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
    t = parse(_take(batch.table["value"], idx).combine_chunks())
    if t is None or "payload" in t.schema.names or "op" not in t.schema.names:
        return {}
    n = t.num_rows
    op = _column(t, "op", (pa.string(),))
    source = t.column("source").combine_chunks() if "source" in t.schema.names else None
    after = t.column("after").combine_chunks() if "after" in t.schema.names else pa.nulls(n)
    if after.type == pa.null():
        after = pa.nulls(n, pa.struct([]))
    doc_ts = _column(t, "ts_ms", (pa.int64(),))
    if (
        op is None
        or doc_ts is None
        or source is None
        or not pa.types.is_struct(source.type)
        or any(f.type not in _SCALARS for f in source.type)
        or not pa.types.is_struct(after.type)
        or any(f.type not in _SCALARS for f in after.type)
    ):
        return {}
    names = [f.name for f in after.type]
    limits = decoder.limits
    if (
        len(names) > limits.max_columns
        or len({n.lower() for n in names}) < len(names)
        or any(not n.strip() or len(n) > limits.max_name_length or n in RESERVED_COLUMNS for n in names)
    ):
        return {}  # some record's columns may not be held: the per-record route says which
    connector, lsn = _column(source, "connector", (pa.string(),)), _column(source, "lsn", (pa.int64(),))
    table_text, src_ts = _column(source, "table", (pa.string(),)), _column(source, "ts_ms", (pa.int64(),))
    marker = _column(source, "snapshot", (pa.string(), pa.bool_(), pa.int64()))
    if connector is None or lsn is None or table_text is None or src_ts is None or marker is None:
        return {}

    is_d = pc.equal(op, "d")
    after_text, types_text, bad = after_json(after)
    keys = key_texts(_take(batch.table["key"], idx).combine_chunks(), decoder.key_format)
    tables = mapped(table_text, lambda text: _table_or_none(text, limits.max_table_name_length))
    keyed = [t for t in pc.unique(tables).to_pylist() if t is not None and decoder.key_fields(t)]
    ok = pc.and_kleene(pc.is_in(op, FAST_OPS), pc.is_valid(source))
    for cond in (
        pc.equal(pc.utf8_lower(connector), "postgresql"),
        pc.is_valid(lsn),
        pc.is_valid(tables),
        pc.is_valid(keys),
        pc.or_(is_d, pc.is_valid(after)),
        pc.invert(bad),
        pc.invert(pc.is_in(tables, pa.array(keyed, pa.string()))),
    ):
        ok = pc.and_kleene(ok, cond)
    ok = ok.fill_null(False)
    if not pc.any(ok).as_py():
        return {}

    snapshot = pc.or_(
        pc.equal(op, "r"),
        pc.is_in(pc.utf8_lower(marker.cast(pa.string())), pa.array(sorted(SNAPSHOT_MARKERS))).fill_null(False),
    )
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
        taken, cols = (
            (idx, columns)
            if pc.all(mask.fill_null(False)).as_py()  # usual: every record, one table
            else (idx.filter(mask), {c: a.filter(mask) for c, a in columns.items()})
        )
        out[table] = Rows(_with_record_columns(batch, taken, cols, now), taken)
    return out


def _table_or_none(text: str, max_length: int) -> str | None:
    try:
        return _source_table(text, max_length)
    except DecodeError:
        return None


__all__ = ["Decoded", "Rows", "dead_letter_rows", "decode_batch", "log_rows"]

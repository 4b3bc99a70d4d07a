"""The stage of a Spark ingest batch: decode, then write data files (runs on executors).

Spark hands each task its raw records as Arrow batches (`RECORD_SCHEMA`, in log order);
`stage_records` turns them into rows of `STAGED_SCHEMA`: one row per record, for its sink
(`<t>__log` or `<t>__dead_letters`), with the sink's own columns filled. A row is `fresh`
when its sequence number is at or after what its sink has already committed for its
stream, so a replayed batch adds nothing twice. Events over their table's size limit become
dead letters (reason `size`) here, like any other bad record.

`write_stage` then writes each sink's fresh rows of each stream as data files of the sink's
table, where the task runs, and gives Spark one summary row per sink and stream
(`WRITTEN_SCHEMA`): counts, bytes, first and last position, the files. The driver decides
on the summaries (quotas) and commits the files; no record crosses back to the JVM.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from connector.batch import RECORD_SCHEMA, RecordBatch, Rows, at_or_after, dead_letter_rows, decode_batch
from connector.core.records import DeadLetter
from connector.debezium import Decoder
from iceberg.layouts import DEAD_LETTER_SCHEMA, DEAD_LETTERS_SUFFIX, HEADERS_TYPE, LOG_SCHEMA, LOG_SUFFIX
from iceberg.log_writer import DataFileWriter, FileTarget
from quotas.admit import oversized, size_detail
from quotas.ledger import table_quota
from quotas.tiers import TierQuota

if TYPE_CHECKING:
    from connector.core.config import Settings

# The log's columns, then what only a dead letter has: its raw key, the reason and detail.
STAGED_SCHEMA = pa.schema(
    [pa.field("sink", pa.string()), pa.field("fresh", pa.bool_())]
    + [f.with_nullable(True) for f in LOG_SCHEMA]
    + [pa.field("raw_key", pa.binary()), pa.field("reason", pa.string()), pa.field("detail", pa.string())]
)

# What a task gives back per sink and stream.
WRITTEN_SCHEMA = pa.schema(
    [
        ("sink", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("n", pa.int64()),  # records
        ("fresh_n", pa.int64()),  # of them not yet in the sink
        ("bytes", pa.int64()),  # payload bytes of the fresh ones (what quotas count)
        ("first", pa.int64()),  # the lowest fresh sequence number
        ("enqueued_min", pa.int64()),  # the fresh ones' oldest enqueued time (microseconds)
        ("enqueued_max", pa.int64()),  # and their newest
        ("last", pa.int64()),  # the highest sequence number
        ("last_offset", pa.string()),  # its offset
        ("routed", pa.bool_()),  # a change routed to the sink's table (not only tombstones)
        ("files", pa.binary()),  # the fresh rows' data files (`compat.encode_data_files`); null: not written
        ("reasons", pa.string()),  # dead letters: {reason: count} of the fresh ones, as JSON
        ("examples", pa.string()),  # dead letters: the first few fresh, [[offset, reason, detail]], as JSON
    ]
)
EXAMPLES = 20  # dead letters per sink and stream a task describes for the log


@dataclass
class StageContext:
    """What a task needs, shipped from the driver: the decoder (with the topic -> table map
    learned so far), the committed positions per sink, the size limit per table, the
    batch's ingest time and the tables of the sinks known to the batch."""

    decoder: Decoder
    floors: Mapping[str, Mapping[str, int]]
    quota_of: Callable[[str], TierQuota | None]  # a table's tier quota (its event size limit)
    now: datetime
    expand: Callable[[pa.Table], pa.Table] | None = None  # the source's reader (`Source.expand`)
    targets: Mapping[str, FileTarget] = field(default_factory=dict)  # the sinks' tables known to the batch
    new_target: Callable[[str], FileTarget] | None = None  # a sink's table not created yet


def _staged(sink: str, rows: pa.Table, floors: Mapping[str, int]) -> pa.Table:
    columns = {n: rows[n] for n in rows.column_names}
    if sink.endswith(DEAD_LETTERS_SUFFIX):
        columns["raw_key"] = columns.pop("key")
    n = rows.num_rows
    columns["sink"] = pa.repeat(pa.scalar(sink), n)
    columns["fresh"] = at_or_after(rows, floors) if n else pa.array([], pa.bool_())
    return pa.Table.from_arrays(
        [columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in STAGED_SCHEMA], schema=STAGED_SCHEMA
    )


def stage_records(ctx: StageContext, records: pa.Table) -> pa.Table:
    """Staged rows for a table of records (`RECORD_SCHEMA`) in log order."""
    batch = RecordBatch(records)
    decoded = decode_batch(ctx.decoder, batch, ctx.now, threads=1)
    parts: list[pa.Table] = []
    letters: dict[str, list[DeadLetter]] = {t: list(ls) for t, ls in decoded.letters.items()}
    for table, pieces in decoded.events.items():
        rows = Rows.concat(pieces)
        quota = ctx.quota_of(table)
        over = oversized(quota, rows.table["payload_bytes"]) if quota else None
        if over is not None and pc.any(over).as_py():
            for record in batch.records(rows.idx.filter(over).to_pylist()):
                detail = size_detail(quota, record.nbytes)  # type: ignore[arg-type]
                letters.setdefault(table, []).append(DeadLetter(record, table, "size", detail))
            rows = rows.keep(pc.invert(over))
        sink = table + LOG_SUFFIX
        parts.append(_staged(sink, rows.table, ctx.floors.get(sink, {})))
    for table, dead in letters.items():
        sink = table + DEAD_LETTERS_SUFFIX
        rows = dead_letter_rows(dead, ctx.now)
        parts.append(_staged(sink, rows, ctx.floors.get(sink, {})))
    return pa.concat_tables(parts) if parts else STAGED_SCHEMA.empty_table()


def headers_from_json(text: pa.Array) -> pa.Array:
    """Headers that Spark's `to_json` wrote (values in base64) back as Kafka's list of
    (key, value) pairs. Spark hands a null array column to Python slowly, text quickly."""
    if text.null_count == len(text):
        return pa.nulls(len(text), HEADERS_TYPE)
    return pa.array(
        [
            None
            if t is None
            else [
                {"key": h["key"], "value": base64.b64decode(h["value"]) if "value" in h else None}
                for h in orjson.loads(t)
            ]
            for t in text.to_pylist()
        ],
        HEADERS_TYPE,
    )


def _records(ctx: StageContext, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.Table]:
    """A task's records (`RECORD_SCHEMA`) from its raw record batches (`RAW_COLUMNS`, the
    headers as JSON text), or from each row of what `ctx.expand` reads them from."""
    for raw in batches:
        table = pa.Table.from_batches([raw])
        for part in (table.slice(i, 1) for i in range(raw.num_rows)) if ctx.expand is not None else [table]:
            if ctx.expand is not None:
                part = ctx.expand(part)
            elif part.num_rows:
                i = part.schema.get_field_index("headers")
                part = part.set_column(i, "headers", headers_from_json(part.column(i).combine_chunks()))
            if part.num_rows:
                yield part.cast(RECORD_SCHEMA)


def write_stage(ctx: StageContext, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` function: a task's raw record batches -> its fresh rows written as data
    files of their sinks' tables (one per sink and stream, batch by batch: a task holds one
    batch of records at a time), and one summary row per sink and stream (`WRITTEN_SCHEMA`)."""
    parts: dict[tuple[str, str, int], _Part] = {}
    for records in _records(ctx, batches):
        staged = stage_records(ctx, records)
        for key, group in _groups(staged):
            if key not in parts:
                parts[key] = _Part(ctx, *key)
            parts[key].add(group)
    if parts:
        yield pa.RecordBatch.from_pylist([p.close() for p in parts.values()], schema=WRITTEN_SCHEMA)


def _groups(staged: pa.Table) -> Iterator[tuple[tuple[str, str, int], pa.Table]]:
    """The staged rows of each sink and stream, in log order."""
    keys = staged.select(["sink", "topic", "partition"]).group_by(["sink", "topic", "partition"]).aggregate([])
    for sink, topic, partition in zip(*(keys[n].to_pylist() for n in keys.column_names)):
        if keys.num_rows == 1:
            yield (sink, topic, partition), staged
            return
        mask = pc.and_(
            pc.and_(pc.equal(staged["sink"], sink), pc.equal(staged["topic"], topic)),
            pc.equal(staged["partition"], partition),
        )
        yield (sink, topic, partition), staged.filter(mask)


class _Part:
    """One sink and stream of a task: its running summary, its fresh rows written as one data
    file of the sink's table (none if its table is not known to the batch)."""

    def __init__(self, ctx: StageContext, sink: str, topic: str, partition: int):
        self.sink, self.topic, self.partition = sink, topic, partition
        self.n = self.fresh_n = self.bytes = 0
        self.first: int | None = None
        self.enqueued: tuple[int, int] | None = None  # the fresh rows' (oldest, newest) enqueued time, us
        self.last: tuple[int, str] | None = None
        self.routed = False
        self.letters = sink.endswith(DEAD_LETTERS_SUFFIX)
        self.reasons: dict[str, int] = {}
        self.examples: list[list[Any]] = []
        target = ctx.targets.get(sink) or (ctx.new_target(sink) if ctx.new_target else None)
        self.writer = DataFileWriter(target) if target is not None else None
        self.layout = DEAD_LETTER_SCHEMA if self.letters else LOG_SCHEMA

    def add(self, group: pa.Table) -> None:
        fresh = group["fresh"].combine_chunks()
        rows = group.filter(fresh) if fresh.false_count else group
        seqs = group["sequence_number"]
        last = pc.max(seqs)
        last_at = (last.as_py(), group["offset"][pc.index(seqs, last).as_py()].as_py())
        self.last = last_at if self.last is None else max(self.last, last_at)
        self.n += group.num_rows
        self.routed = self.routed or bool(
            pc.any(pc.and_(pc.is_valid(group["op"]), pc.invert(group["tombstone"].fill_null(False)))).as_py()
        )
        if not rows.num_rows:
            return
        self.fresh_n += rows.num_rows
        self.bytes += pc.sum(rows["payload_bytes"]).as_py() or 0
        first = pc.min(rows["sequence_number"]).as_py()
        self.first = first if self.first is None else min(self.first, first)
        times = pc.min_max(rows["enqueued_time"].cast(pa.timestamp("us", "UTC")).cast(pa.int64()))
        if times["min"].is_valid:
            lo, hi, was = times["min"].as_py(), times["max"].as_py(), self.enqueued
            self.enqueued = (lo, hi) if was is None else (min(was[0], lo), max(was[1], hi))
        if self.letters:
            reasons = rows.group_by("reason").aggregate([("reason", "count")])
            for reason, n in zip(reasons["reason"].to_pylist(), reasons["reason_count"].to_pylist()):
                self.reasons[reason] = self.reasons.get(reason, 0) + n
            head = rows.slice(0, EXAMPLES - len(self.examples))
            self.examples += [list(r) for r in zip(*(head[c].to_pylist() for c in ("offset", "reason", "detail")))]
        if self.writer is not None:
            columns = [rows["raw_key" if self.letters and n == "key" else n] for n in self.layout.names]
            self.writer.write(pa.Table.from_arrays(columns, schema=self.layout))

    def close(self) -> dict[str, Any]:
        assert self.last is not None
        return {
            "sink": self.sink,
            "topic": self.topic,
            "partition": self.partition,
            "n": self.n,
            "fresh_n": self.fresh_n,
            "bytes": self.bytes,
            "first": self.first,
            "enqueued_min": self.enqueued[0] if self.enqueued else None,
            "enqueued_max": self.enqueued[1] if self.enqueued else None,
            "last": self.last[0],
            "last_offset": self.last[1],
            "routed": self.routed,
            "files": self.writer.close() if self.writer is not None else None,
            "reasons": orjson.dumps(self.reasons).decode() if self.reasons else None,
            "examples": orjson.dumps(self.examples).decode() if self.examples else None,
        }


class Quotas:
    """A table's tier quota for the stage (picklable, cached per task); None for a table
    whose tier cannot be resolved: the driver resolves every table of the batch before
    writing and reports that one clearly."""

    def __init__(self, settings: Settings | None):
        self.settings = settings
        self._known: dict[str, TierQuota | None] = {}

    def __call__(self, table: str) -> TierQuota | None:
        if self.settings is None:
            return None
        if table not in self._known:
            try:
                self._known[table] = table_quota(self.settings, table)
            except Exception:  # noqa: BLE001 - reported by the driver
                self._known[table] = None
        return self._known[table]


__all__ = ["STAGED_SCHEMA", "WRITTEN_SCHEMA", "StageContext", "Quotas", "stage_records", "write_stage"]

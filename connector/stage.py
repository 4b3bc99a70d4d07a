"""The decode stage of a Spark ingest batch (pure: Arrow in, Arrow out; runs on executors).

Spark hands each task its raw records as Arrow batches (`RECORD_SCHEMA`, one source
partition per task, in log order); `decode_stage` turns them into rows of `STAGED_SCHEMA`:
one row per record, for its sink (`<t>__log` or `<t>__dead_letters`), with the sink's own
columns filled. A row is `fresh` when its sequence number is at or after what its sink has
already committed for its stream, so a replayed batch adds nothing twice. Events over their
table's size limit become dead letters (reason `size`) here, like any other bad record.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from connector.batch import RECORD_SCHEMA, RecordBatch, Rows, at_or_after, dead_letter_rows, decode_batch
from connector.core.records import DeadLetter
from connector.debezium import Decoder
from iceberg.layouts import DEAD_LETTERS_SUFFIX, HEADERS_TYPE, LOG_SCHEMA, LOG_SUFFIX
from quotas.admit import event_too_large
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


@dataclass
class StageContext:
    """What a task needs, shipped from the driver: the decoder (with the topic -> table map
    learned so far), the committed positions per sink, the size limit per table and the
    batch's ingest time."""

    decoder: Decoder
    floors: Mapping[str, Mapping[str, int]]
    quota_of: Callable[[str], TierQuota | None]  # a table's tier quota (its event size limit)
    now: datetime
    expand: Callable[[pa.Table], pa.Table] | None = None  # the source's reader (`Source.expand`)


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
        over = pc.greater(rows.table["payload_bytes"], quota.max_event_bytes) if quota else None
        if over is not None and pc.any(over).as_py():
            for record in batch.records(rows.idx.filter(over).to_pylist()):
                detail = event_too_large(quota, record.nbytes) or "over the size limit"  # type: ignore[arg-type]
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


def decode_stage(ctx: StageContext, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` function: a task's raw record batches (`RAW_COLUMNS`, the headers as
    JSON text), or what `ctx.expand` reads them from -> staged row batches."""
    for raw in batches:
        if raw.num_rows:
            table = pa.Table.from_batches([raw])
            if ctx.expand is not None:
                table = ctx.expand(table)
            else:
                i = table.schema.get_field_index("headers")
                table = table.set_column(i, "headers", headers_from_json(table.column(i).combine_chunks()))
            if table.num_rows:
                yield from stage_records(ctx, table.cast(RECORD_SCHEMA)).to_batches()


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


__all__ = ["STAGED_SCHEMA", "StageContext", "decode_stage", "Quotas", "stage_records"]

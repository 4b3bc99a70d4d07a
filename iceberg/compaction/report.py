"""What a compaction round records and reads about its table: its report, the cheap checks
made from metadata (has rows, may hold an expired tombstone), the round's truncates, and its
progress step by step. The snapshot properties it writes are `iceberg.summary_keys`."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.expressions import BooleanExpression, LessThanOrEqual
from pyiceberg.table import Table
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from connector.core.ordering import Ordering, Truncate
from iceberg import compat, leases
from iceberg.compaction.policy import CleanRange
from iceberg.maintenance import sql_literal
from iceberg.summary_keys import EXPIRES_FROM, NEVER, STREAM_BYTES

log = logging.getLogger("iceberg.compaction.job")  # the round's progress lines, with the job's own
EPOCH = datetime.fromtimestamp(0, UTC)


@dataclass
class CompactionReport:
    table: str
    ranges: list[CleanRange] = field(default_factory=list)
    events: int = 0
    keys: int = 0
    upserts: int = 0
    deletes: int = 0
    stale: int = 0
    stale_reasons: dict[str, int] = field(default_factory=dict)
    truncates: int = 0
    truncated: int = 0  # keys a truncate removed (held in the state, or changed in this round only)
    refused: int = 0  # winners the state table cannot hold: dead letters (reason `schema`)
    purged: int = 0
    trimmed: int = 0  # log rows past the log retention removed
    maintenance: list[str] = field(default_factory=list)
    seconds: float = 0.0
    ran: bool = True  # False: nothing was due (said by the table's metadata), no round ran

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d["ranges"] = {r.stream: [r.start, r.end] for r in self.ranges}
        return d


def range_filter(ranges: list[CleanRange]) -> str:
    def one(r: CleanRange) -> str:
        return (
            f"(topic = {sql_literal(r.topic)} AND partition = {r.partition} "
            f"AND sequence_number >= {r.start} AND sequence_number < {r.end})"
        )

    return " OR ".join(one(r) for r in ranges)


def has_rows(catalog: Catalog, name: str) -> bool:
    return holds_rows(catalog.load_table(name))


def holds_rows(table: Table) -> bool:
    """Whether the table's current snapshot holds rows (its summary's total, no file read)."""
    rows = total_rows(table)
    return rows is None or rows > 0


def total_rows(table: Table) -> int | None:
    """The rows the table's current snapshot holds, by its summary (0 without a snapshot or
    summary; None where the summary does not say)."""
    snapshot = table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return 0
    total = snapshot.summary.additional_properties.get("total-records")
    return None if total is None else int(total)


def expired_by(now: datetime) -> BooleanExpression:
    # pyiceberg's expressions take (term, literal); the pydantic mypy plugin reads them as keyword-only
    return LessThanOrEqual("expires_at", now.isoformat())  # type: ignore[call-arg,misc]


def may_expire(catalog: Catalog, name: str, now: datetime, earliest: datetime | None = None) -> bool:
    """Whether the tombstones may hold one expired by `now`: by the earliest expiry their
    commits record (`summary_keys.EXPIRES_FROM`, no file read; `earliest`: that record, where
    the caller holds it). A table whose newest commit of its bytes does not record it
    (written before the key was) is told by its files: the `expires_at` bounds in the
    manifests rule out most without reading a row, and a file they keep is read (that column
    only, its deletes applied), since it may hold only tombstones a MERGE or a purge has
    deleted, until a rewrite drops them."""
    if earliest is None:
        table = catalog.load_table(name)
        earliest = EXPIRES_FROM.read(table, with_key=STREAM_BYTES)
        if earliest is None:  # one plan: reads only the files the bounds keep
            scan = table.scan(row_filter=expired_by(now), selected_fields=("expires_at",))
            return bool(scan.to_arrow().num_rows > 0)
    return earliest <= now


def earliest_expiry(table: Table, now: datetime) -> datetime:
    """The earliest `expires_at` later than `now` among the tombstones of `table` (`NEVER`:
    none): what a purge at `now` leaves. A file whose lower bound in the manifests is later
    than `now` gives that bound (at or before its rows'); one whose upper bound is not later
    holds only expired tombstones; the rest (a file of several rounds' tombstones, some
    expired, or one without bounds) are read, that column only, their deletes applied."""
    scan = table.scan(selected_fields=("expires_at",))
    field, at = table.schema().find_field("expires_at").field_id, micros(now)
    found, read = [], []
    for task in scan.plan_files():
        low, high = ((b or {}).get(field) for b in (task.file.lower_bounds, task.file.upper_bounds))
        if low is not None and _long(low) > at:
            found.append(_long(low))
        elif high is None or _long(high) > at:
            read.append(task)
    if read:
        values = compat.file_reader(scan)(read)["expires_at"].cast(pa.int64())
        later = pc.min(pc.filter(values, pc.greater(values, at))).as_py()
        found += [later] if later is not None else []
    return EPOCH + timedelta(microseconds=min(found)) if found else NEVER


def _long(bound: bytes) -> int:
    return int.from_bytes(bound, "little", signed=True)  # a timestamp's bound: microseconds


def utc(t: datetime) -> datetime:
    """`t` in UTC; a naive time is taken as UTC (a pass's and a round's `now`)."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def micros(t: datetime) -> int:
    """`t` (aware) in microseconds since the epoch, exactly."""
    return (t - EPOCH) // timedelta(microseconds=1)


def round_truncates(dirty: DataFrame, ordering: Ordering) -> list[Truncate]:
    """The round's truncates, oldest first."""
    rows = (
        dirty.where(F.col("op") == "t")
        .select(
            "topic",
            "partition",
            "offset",
            "sequence_number",
            F.unix_micros("enqueued_time").alias("us"),
            "source_position",
            "snapshot",
            "source_ts_ms",
        )
        .collect()
    )
    found = [
        Truncate(
            r["topic"],
            r["partition"],
            r["offset"],
            r["sequence_number"],
            r["us"],
            tuple(r["source_position"]) if r["source_position"] else None,
            r["snapshot"],
            r["source_ts_ms"],
        )
        for r in rows
    ]
    return sorted(found, key=lambda t: t.newness(ordering))


class Steps:
    """Logs how long each step of a round took (progress on long rounds, and where time goes)."""

    def __init__(self, table: str, lease: leases.Lease | None = None):
        self.table, self.lease, self.t = table, lease, time.monotonic()

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        log.info("%s: %s took %.2f s", self.table, name, now - self.t)
        self.t = now
        if self.lease is not None:  # before the next step commits: stop if the lease was taken over
            self.lease.renew()

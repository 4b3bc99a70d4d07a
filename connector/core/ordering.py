"""The ordering rule: which of two changes to one key is newer.

`order_key` states it in Python (the newest truncate of a round, the planner); the
compaction job runs it as Spark expressions over the same fields
(`iceberg.compaction.dedupe.order_struct`); the table-driven test runs its cases through both.

`ordering = "source"` compares, in this order:

1. the Debezium source position, a tuple of integers (empty when the event has none):
   PostgreSQL `(lsn,)`; MySQL `(binlog file number, pos, row)`; SQL Server
   `(*commit_lsn, *change_lsn, event_serial_no)` with each LSN split into its three hex
   parts; Oracle `(scn,)`. Tuples compare lexicographically, and `()` is older than any
   position, exactly like Spark's ordering of `array<bigint>`.
2. the rank: at an equal position a snapshot read (`op=r`, or any event flagged
   `source.snapshot`) is older than a streamed change, so a snapshot never overwrites a
   streamed change (contract rule 2).
3. the log position `(partition, sequence_number)`: later in the log is newer.

A position-less event (a bare tombstone, say) takes the highest position seen for its key
earlier in the log, so the Debezium pair delete + tombstone resolves to the tombstone and
the result does not depend on how the log was split into compaction rounds.

`ordering = "log"` is Event Hubs / Kafka behaviour between changes: `(partition,
sequence_number)` decides, the highest offset wins; but a snapshot read still never
overwrites a streamed change (rank first), so a replayed snapshot cannot rewind a row.

A truncate removes the keys whose newest change is older than it (the compaction job's
`iceberg.compaction.dedupe.older_than_truncate`): under `source` by the order key above;
under `log` by time, since offsets of different partitions are not comparable: an earlier
sequence number on the truncate's own stream, or an earlier enqueued time on any other.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from connector.core.errors import DecodeError

Ordering = Literal["source", "log"]
Position = tuple[int, ...]
OrderKey = tuple[Position, int, int, int]

SNAPSHOT_MARKERS = frozenset(
    {"true", "first", "first_in_data_collection", "last_in_data_collection", "last", "incremental"}
)


def order_key(
    position: Position | None, snapshot: bool, partition: int, sequence_number: int, ordering: Ordering
) -> OrderKey:
    """The sort key of one change; the greatest key of a set of changes is the newest."""
    rank = 0 if snapshot else 1
    if ordering == "log":
        return ((), rank, partition, sequence_number)
    return (position or (), rank, partition, sequence_number)


@dataclass(frozen=True)
class Truncate:
    """A table-level truncate marker (`op=t`): never purged; any change older than it is
    removed, or is stale when it arrives after the marker was recorded."""

    topic: str
    partition: int
    offset: str
    sequence_number: int
    enqueued_us: int  # enqueued time, microseconds since the epoch (UTC)
    position: Position | None = None
    snapshot: bool = False
    source_ts_ms: int | None = None

    def newness(self, ordering: Ordering) -> tuple[Any, ...]:
        """Sort key among truncates: the greatest is the table's marker."""
        if ordering == "log":
            return (self.enqueued_us, self.partition, self.sequence_number)
        return order_key(self.position, self.snapshot, self.partition, self.sequence_number, ordering)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Truncate:
        d = json.loads(text)
        return cls(**{**d, "position": tuple(d["position"]) if d.get("position") is not None else None})


def newest_truncate(truncates: Iterable[Truncate | None], ordering: Ordering) -> Truncate | None:
    known = [t for t in truncates if t is not None]
    return max(known, key=lambda t: t.newness(ordering)) if known else None


def is_snapshot(source: dict[str, Any] | None, op: str) -> bool:
    if op == "r":
        return True
    marker = (source or {}).get("snapshot")
    return str(marker).lower() in SNAPSHOT_MARKERS if marker is not None else False


def source_position(source: dict[str, Any] | None) -> Position | None:
    """The comparable position of a Debezium `source` block, or None if it has none."""
    if not source:
        return None
    connector = str(source.get("connector") or "").lower()
    if connector == "postgresql" or (not connector and "lsn" in source):
        return _postgres(source)
    if connector == "mysql" or (not connector and "file" in source and "pos" in source):
        return _mysql(source)
    if connector == "sqlserver" or (not connector and "commit_lsn" in source):
        return _sqlserver(source)
    if source.get("scn") is not None:
        return (position_int(source["scn"], "scn"),)
    return None


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def position_int(value: Any, what: str) -> int:
    """A position element: an integer (or its decimal digits as text) in the 64-bit range,
    else a DecodeError (reason `position`): never rounded (1.5), cast (true) or wrapped (2**70)."""
    if type(value) is str and value.isascii() and value.isdigit():
        value = int(value)
    if type(value) is not int or not INT64_MIN <= value <= INT64_MAX:
        raise DecodeError("position", f"source.{what} = {value!r} is not an integer in the 64-bit range")
    return value


def _postgres(source: dict[str, Any]) -> Position | None:
    lsn = source.get("lsn")
    if lsn is None and source.get("sequence"):
        try:
            seq = json.loads(source["sequence"])
        except (TypeError, ValueError):
            raise DecodeError("position", f"source.sequence = {source['sequence']!r} is not a JSON list") from None
        lsn = seq[-1] if type(seq) is list and seq else None
    return (position_int(lsn, "lsn"),) if lsn is not None else None


def _mysql(source: dict[str, Any]) -> Position | None:
    file, pos = source.get("file"), source.get("pos")
    if not file or pos is None:
        return None
    suffix = str(file).rsplit(".", 1)[-1]
    file_no = position_int(suffix, "file") if suffix.isdigit() else 0
    return (file_no, position_int(pos, "pos"), position_int(source.get("row") or 0, "row"))


def _lsn_parts(text: str | None, what: str) -> list[int] | None:
    if not text:
        return None
    try:
        parts = [int(p, 16) for p in str(text).split(":")]
    except ValueError:
        return None
    if len(parts) > 3:
        return None
    return [position_int(p, what) for p in (parts + [0, 0, 0])[:3]]


def _sqlserver(source: dict[str, Any]) -> Position | None:
    commit = _lsn_parts(source.get("commit_lsn"), "commit_lsn")
    if commit is None or not any(commit):
        return None  # degenerate ("00") or missing: fall back to log order
    change = _lsn_parts(source.get("change_lsn"), "change_lsn") or [0, 0, 0]
    return (*commit, *change, position_int(source.get("event_serial_no") or 0, "event_serial_no"))

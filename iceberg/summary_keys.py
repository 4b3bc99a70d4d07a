"""The commit contract: every `cdclake.*` key the product writes into an Iceberg snapshot
summary, each defined once with its codec, the tables it is written on, whether it stays in
force past the commits that do not write it, and whether `rebuild` keeps it. Writers take a
key's entry from here (`KEY.entry(value)`), readers its value (`KEY.read(table)`: the newest
snapshot of the current ancestry that has it; `KEY.of(snapshot)`: one snapshot's).

A carried key stays in force across the commits that do not write it (a maintenance rewrite,
a purge, a log trim, an ingest commit of nothing): readers walk back to the newest snapshot
that has it, and maintenance never expires the newest snapshot of a table carrying its
`MARKERS` key. Every other carried key of that table is written in the same commit as the
marker (a round's state commit writes the cleaner points, the bytes, the truncate marker and
the ordering rule together), so it stays reachable too. A key not carried is the record of
the commit that wrote it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from connector.core.ordering import Truncate

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

T = TypeVar("T")
TableKind = Literal["log", "dead_letters", "state", "tombstones"]  # as `TableNames` names them


def _counts_json(value: Mapping[str, int]) -> str:
    return json.dumps(dict(sorted(value.items())), separators=(",", ":"))


def _counts(raw: str) -> dict[str, int]:
    return {k: int(v) for k, v in json.loads(raw).items()}


def _ranges_json(value: Mapping[str, list[int]]) -> str:
    return json.dumps(value, separators=(",", ":"))  # in the round's order


def _ranges(raw: str) -> dict[str, list[int]]:
    return {k: [int(x) for x in v] for k, v in json.loads(raw).items()}


def _text(value: str) -> str:
    return value


@dataclass(frozen=True)
class SummaryKey(Generic[T]):
    """One snapshot-summary key: its name, how a value is written and read back, where it is
    written, whether it is carried (module docstring) and whether `rebuild` writes the
    recomputation's value of it on the tables it replaces."""

    name: str
    tables: frozenset[TableKind]
    encode: Callable[[T], str]
    decode: Callable[[str], T]
    carried: bool
    rebuild_keeps: bool = False

    def entry(self, value: T) -> dict[str, str]:
        """The summary entry a commit writes for `value`."""
        return {self.name: self.encode(value)}

    def held_by(self, snapshot: Snapshot) -> bool:
        return snapshot.summary is not None and self.name in snapshot.summary.additional_properties

    def of(self, snapshot: Snapshot) -> T | None:
        """The value `snapshot` itself records (None: none)."""
        raw = snapshot.summary.additional_properties.get(self.name) if snapshot.summary else None
        return self.decode(raw) if raw else None

    def read(self, table: Table, snapshot_id: int | None = None, with_key: SummaryKey[Any] | None = None) -> T | None:
        """The value in force at the current snapshot (at `snapshot_id`): that of the newest
        snapshot of its ancestry that has the key (or that has `with_key`: the writer of the
        newest commit that recorded positions, say)."""
        raw = newest_raw(table, self.name, with_key.name if with_key else None, snapshot_id)
        return self.decode(raw) if raw else None


def newest_raw(table: Table, key: str, with_key: str | None = None, snapshot_id: int | None = None) -> str | None:
    """The encoded value of `key` as `SummaryKey.read` finds it. The walk ends where the
    ancestry does, or at a parent that expiry removed."""
    snapshot = table.current_snapshot() if snapshot_id is None else table.snapshot_by_id(snapshot_id)
    while snapshot is not None:
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if (with_key or key) in props:
            return props.get(key)
        if snapshot.parent_snapshot_id is None:
            return None
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id)
    return None


# Next sequence number to read per stream (`topic:partition`) that the table has accounted for,
# written with the rows of each ingest commit: ingest resumes from it (exactly once).
POSITIONS: SummaryKey[dict[str, int]] = SummaryKey(
    "cdclake.positions", frozenset({"log", "dead_letters"}), _counts_json, _counts, carried=True
)
# Which process made an ingest commit (host and pid): named when another writer is met.
WRITER: SummaryKey[str] = SummaryKey("cdclake.writer", frozenset({"log", "dead_letters"}), _text, _text, carried=False)
# The cleaner point per stream: where the next round starts; in the round's state commit.
CLEANER_POINTS: SummaryKey[dict[str, int]] = SummaryKey(
    "cdclake.cleaner-points", frozenset({"state"}), _counts_json, _counts, carried=True, rebuild_keeps=True
)
# Bytes (key + payload) the table holds per stream, recorded by each of the round's commits to
# it: the quota usage ingest reads without reading the table's rows.
STREAM_BYTES: SummaryKey[dict[str, int]] = SummaryKey(
    "cdclake.stream-bytes", frozenset({"state", "tombstones"}), _counts_json, _counts, carried=True, rebuild_keeps=True
)
# At or before the earliest `expires_at` of the tombstones (`NEVER`: none), in each round's
# commit to the tombstones: a pass tells from it, without reading a file, that no tombstone
# is due to be purged. A round writing tombstones lowers it to theirs; the purge sets it to
# the remaining ones' earliest.
EXPIRES_FROM: SummaryKey[datetime] = SummaryKey(
    "cdclake.expires-from",
    frozenset({"tombstones"}),
    datetime.isoformat,
    datetime.fromisoformat,
    carried=True,
    rebuild_keeps=True,
)
NEVER = datetime.max.replace(tzinfo=UTC)
# The table's truncate marker after the round, rewritten by every round's state commit.
TRUNCATE: SummaryKey[Truncate] = SummaryKey(
    "cdclake.truncate", frozenset({"state"}), Truncate.to_json, Truncate.from_json, carried=True, rebuild_keeps=True
)
# The ordering rule the state was built by (written by every round and by `rebuild`): a rebuild
# by another rule is refused once log retention removed events that rule may need.
ORDERING: SummaryKey[str] = SummaryKey(
    "cdclake.ordering", frozenset({"state"}), _text, _text, carried=True, rebuild_keeps=True
)
# The round's clean ranges per stream, `[start, end]`: what this round compacted.
ROUND_RANGES: SummaryKey[dict[str, list[int]]] = SummaryKey(
    "cdclake.compaction", frozenset({"state"}), _ranges_json, _ranges, carried=False
)
# The round's stale events by reason.
STALE_REASONS: SummaryKey[dict[str, int]] = SummaryKey(
    "cdclake.stale", frozenset({"state"}), _counts_json, _counts, carried=False
)
# On the log's trimming commit: rows enqueued before this were trimmed by log retention. Read
# as the newest in the ancestry, but no marker holds it: once expiry removes that commit (and
# no later trim wrote another), it is no longer found.
TRIMMED_BEFORE: SummaryKey[datetime] = SummaryKey(
    "cdclake.trimmed-before", frozenset({"log"}), datetime.isoformat, datetime.fromisoformat, carried=False
)
# The log's snapshot the round planned against, in each state commit of a round (with `DIRTY`,
# what it left dirty): a pass decides from them and the log's commits after that snapshot
# whether a table's round has anything to do (`compaction.quiet`).
LOG_SEEN: SummaryKey[int] = SummaryKey("cdclake.log-seen", frozenset({"state"}), str, int, carried=True)
# With it, per stream, the log's rows the round left dirty (too young, or not due), as
# `APPENDED` records them: [first sequence number, end, rows, payload bytes, oldest and newest
# enqueued time in microseconds] (an estimate erring towards due).
DIRTY: SummaryKey[dict[str, list[int]]] = SummaryKey(
    "cdclake.dirty", frozenset({"state"}), _ranges_json, _ranges, carried=True
)

# On each ingest commit of log rows or dead letters, per stream: [first sequence number, end
# (exclusive), rows, payload bytes, oldest and newest enqueued time in microseconds] of the rows
# it appends. A pass tells from them, without reading the log, that a table's dirty events
# cannot make its round due yet (`compaction.quiet`), and the retention that no row of the log
# or dead letters may be older than its cut-off (`compaction.retention.may_be_older`).
APPENDED: SummaryKey[dict[str, list[int]]] = SummaryKey(
    "cdclake.appended", frozenset({"log", "dead_letters"}), _ranges_json, _ranges, carried=False
)

KEYS: tuple[SummaryKey[Any], ...] = (
    POSITIONS,
    WRITER,
    CLEANER_POINTS,
    STREAM_BYTES,
    EXPIRES_FROM,
    TRUNCATE,
    ORDERING,
    ROUND_RANGES,
    STALE_REASONS,
    TRIMMED_BEFORE,
    LOG_SEEN,
    APPENDED,
    DIRTY,
)

# Per table, the key whose newest snapshot maintenance never expires (`maintenance.Upkeep`).
MARKERS: dict[TableKind, SummaryKey[Any]] = {
    "log": POSITIONS,
    "dead_letters": POSITIONS,
    "state": CLEANER_POINTS,
    "tombstones": STREAM_BYTES,
}


def carried_entries(table: Table, kind: TableKind) -> dict[str, str]:
    """The carried keys of a `kind` table as they stand (a commit of properties alone writes
    them again, so that they stay reachable with the marker it writes)."""
    keys = [k for k in KEYS if k.carried and kind in k.tables]
    return {k.name: raw for k in keys if (raw := newest_raw(table, k.name)) is not None}


def rebuild_entries(source: Table, kind: TableKind) -> dict[str, str]:
    """The entries `rebuild` writes on its `kind` table: the keys it keeps, as the
    recomputation's `source` table holds them (each one it has)."""
    keys = [k for k in KEYS if k.rebuild_keeps and kind in k.tables]
    return {k.name: raw for k in keys if (raw := newest_raw(source, k.name)) is not None}

"""Whether a table's round would do anything, from its commits' metadata alone: a pass over
many tables skips the quiet ones without Spark, a lease or a data file read. Also what a
round records for it: the log's snapshot it planned against and what it left dirty; and,
from the same records, the bytes a table's quota counts (`quota_usage`)."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot

from iceberg.catalog import Loaded, TableUnreadableError
from iceberg.compaction.policy import CleanRange, CompactionPolicy, StreamStats, plan
from iceberg.compaction.report import has_rows, may_expire, micros, utc
from iceberg.compaction.retention import due as retention_due
from iceberg.compaction.stats import cleaner_points, held_bytes, load_optional, logged_bytes, sum_streams
from iceberg.layouts import TableNames
from iceberg.maintenance import Upkeep, maintenance_due
from iceberg.summary_keys import APPENDED, CLEANER_POINTS, DIRTY, LOG_SEEN, MARKERS, POSITIONS, carried_entries

log = logging.getLogger(__name__)


def quiet(catalog: Catalog, names: TableNames, policy: CompactionPolicy, now: datetime, force: bool = False) -> bool:
    """Whether a round of the table would do nothing, from its commits' metadata (no Spark, no
    data file read): no row left dirty by its last round (`DIRTY`) nor appended to the log
    since the snapshot that round planned against (`LOG_SEEN`), or (unless `force`) none of
    those rows can make the round due yet (`not_due`); no expired tombstone (`report.may_expire`), the log retention's
    trigger not met, no maintenance due."""
    now = utc(now)
    view: Any = Loaded(catalog)
    try:
        log_table = view.load_table(names.log)
    except NoSuchTableError:
        return True
    state = load_optional(view, names.state)
    if state is None:
        return log_table.current_snapshot() is None or not has_rows(view, names.log)
    dirty = bool(DIRTY.read(state)) or appended_since(log_table, LOG_SEEN.read(state))
    if dirty and (force or not not_due(view, names, policy, now)):
        return False
    if has_rows(view, names.tombstones) and may_expire(view, names.tombstones, now):
        return False
    if policy.log_retention is not None and retention_due(view, names, now - policy.log_retention):
        return False
    return not maintenance_due(view, upkeep(view, names), policy.maintenance)


def _after(log_table: Table, snapshot_id: int | None) -> Iterator[Snapshot | None]:
    """The log's snapshots after its snapshot `snapshot_id`, newest first, then None where that
    is not in the current ancestry (never compacted, or expired)."""
    snapshot = log_table.current_snapshot()
    while snapshot is not None and snapshot.snapshot_id != snapshot_id:
        yield snapshot
        parent = snapshot.parent_snapshot_id
        snapshot = log_table.snapshot_by_id(parent) if parent is not None else None
    if snapshot is None:
        yield None


def _appended(snapshot: Snapshot) -> int:
    """The rows `snapshot` appended: commits of positions alone, trims and rewrites add none."""
    summary = snapshot.summary
    if summary is None or summary.operation != Operation.APPEND:
        return 0
    return int(summary.additional_properties.get("added-records", 0))


def appended_since(log_table: Table, snapshot_id: int | None) -> bool:
    """Whether the log appended a row after its snapshot `snapshot_id` (yes where that is not
    in its ancestry)."""
    return any(s is None or _appended(s) > 0 for s in _after(log_table, snapshot_id))


def not_due(catalog: Catalog, names: TableNames, policy: CompactionPolicy, now: datetime) -> bool:
    """Whether the table's uncompacted rows cannot make its round due now (`policy.plan`), told
    from what its last round left dirty (`DIRTY`) and what each ingest commit since recorded
    appending (`APPENDED`), its cleaner points and the bytes its state and tombstones record:
    no data file is read.
    Every estimate errs towards due: a commit that straddles a stream's cleaner point counts
    whole, and one whose oldest row is older than `min_compaction_lag` counts as cleanable
    whole. The walk back through the log's commits ends at that round's snapshot (`LOG_SEEN`), or at a
    commit before which every row is below the cleaner points (its positions, or the first
    row it appends of a stream, at or below them). False (a round decides) where a commit
    carries no record or the walk runs out of history first."""
    state = load_optional(catalog, names.state)
    if state is None:
        return False
    points = cleaner_points(state)
    dirty: dict[str, list[list[int]]] = {}
    for stream, (first, end, *rest) in (DIRTY.read(state) or {}).items():
        if end > points.get(stream, 0):
            dirty.setdefault(stream, []).append([first, end, *rest])
    for snapshot in _after(catalog.load_table(names.log), LOG_SEEN.read(state)):
        if snapshot is None:
            return False
        record = APPENDED.of(snapshot) if _appended(snapshot) else {}
        if record is None:
            return False
        for stream, (first, end, *rest) in record.items():
            if end > points.get(stream, 0):
                dirty.setdefault(stream, []).append([first, end, *rest])
        # the rows before this commit are below its first row of a stream (it appends only
        # rows past the table's positions), else below its positions
        positions = POSITIONS.of(snapshot)
        if positions is not None and all(
            (record[s][0] if s in record else p) <= points.get(s, 0) for s, p in positions.items()
        ):
            break
    clean = held_bytes(state, load_optional(catalog, names.tombstones)) if dirty else {}
    cutoff = micros(now - policy.min_compaction_lag)
    stats = []
    for stream, commits in dirty.items():
        cleanable = [c for c in commits if c[4] <= cutoff]
        point = points.get(stream, 0)
        # none old enough: the planner's range ends at the first young row, past the point where
        # a gap in the sequence numbers (rows of other tables) precedes it; a commit across
        # the point says nothing of a gap, and that empty range waits for an old enough row
        young_from = max(point, min(c[0] for c in commits))
        stats.append(
            StreamStats(
                stream=stream,
                cleaner_point=point,
                clean_bytes=clean.get(stream, 0),
                dirty_bytes=sum(c[3] for c in commits),
                cleanable_bytes=sum(c[3] for c in cleanable),
                cleanable_end=max((c[1] for c in cleanable), default=young_from),
                first_dirty_time=datetime.fromtimestamp(min(c[4] for c in commits) / 1_000_000, UTC),
            )
        )
    return not plan(stats, policy, now)


def quota_usage(catalog: Catalog, names: TableNames) -> dict[str, int]:
    """Bytes per stream that count against the table's quota: what the state and tombstones
    hold, as their commits recorded it, plus the log's bytes past the cleaner points, from the
    commits' metadata (`logged_since`) or, where that does not tell, by a scan of those rows.
    A state or tombstone table that cannot be read does not stop ingest: every byte of the log
    counts then (more than the usage: quotas stay enforced)."""
    log_table = catalog.load_table(names.log)
    try:
        state, tombstones = load_optional(catalog, names.state), load_optional(catalog, names.tombstones)
        points, held = cleaner_points(state), held_bytes(state, tombstones)
    except TableUnreadableError as e:
        log.warning("%s; until then quota usage counts every byte of the log of %s", e, names.table)
        state, points, held = None, {}, {}
    logged = logged_since(log_table, state, points) if state is not None else None
    if logged is None:
        logged = logged_bytes(log_table, points)
    return {s: n for s, n in sum_streams(logged, held).items() if n}


def logged_since(log_table: Table, state: Table, points: Mapping[str, int]) -> dict[str, int] | None:
    """Per stream, the log's bytes past the cleaner `points` (the `state`'s), from the commits'
    metadata alone: what the round that wrote them left dirty (`DIRTY`, of the log's snapshot
    it planned against, `LOG_SEEN`, both in the commit of the points) plus what each log
    commit since appended (`APPENDED`: ingest appends only past the positions; trims and
    rewrites append nothing). None where that commit records neither (a rebuild's), a log
    commit carries no record, a record straddles a point, or that snapshot is no longer in
    the log's history: the log's rows tell then."""
    seen, dirty = LOG_SEEN.read(state, with_key=CLEANER_POINTS), DIRTY.read(state, with_key=CLEANER_POINTS)
    if seen is None or dirty is None:
        return None
    records = [dirty]
    for snapshot in _after(log_table, seen):
        record = APPENDED.of(snapshot) if snapshot is not None and _appended(snapshot) else {}
        if snapshot is None or record is None:
            return None
        records.append(record)
    out: dict[str, int] = defaultdict(int)
    for record in records:
        for stream, (first, end, _, size, *_) in record.items():
            point = points.get(stream, 0)
            if first < point < end:
                return None
            if end > point:
                out[stream] += size
    return dict(out)


def backlog(catalog: Catalog, names: TableNames) -> int:
    """The rows its last round left dirty and those the table's log appended since (all its
    rows where no round ran), from the commits' metadata: a pass starts the busiest tables first."""
    state = load_optional(catalog, names.state)
    seen = LOG_SEEN.read(state) if state is not None else None
    left = sum(c[2] for c in (DIRTY.read(state) or {}).values()) if state is not None else 0
    return left + sum(_appended(s) for s in _after(catalog.load_table(names.log), seen) if s is not None)


def upkeep(catalog: Catalog, names: TableNames) -> list[Upkeep]:
    """The table's tables maintenance looks after, each with the key of its newest snapshot it keeps."""
    return [
        Upkeep(names.state, MARKERS["state"]),
        Upkeep(names.tombstones, MARKERS["tombstones"]),
        *[
            Upkeep(n, marker, append_only=True)
            for n, marker in ((names.log, MARKERS["log"]), (names.dead_letters, MARKERS["dead_letters"]))
            if catalog.table_exists(n)
        ],
    ]


def left_dirty(stats: Iterable[StreamStats], ranges: list[CleanRange], now: datetime) -> dict[str, list[int]]:
    """Per stream, the log's rows a round of `ranges` leaves dirty, as `APPENDED` records a
    commit's (`DIRTY`): [first sequence number at most, end, rows, payload bytes, oldest
    enqueued time (us), the plan's time (us)]."""
    planned = {r.stream: r for r in ranges}
    out = {}
    for s in stats:
        r = planned.get(s.stream)
        rows = s.dirty_events - (s.cleanable_events if r else 0)
        oldest = (s.young_time if r else None) or s.first_dirty_time
        if rows <= 0 or oldest is None:
            continue
        first = r.end if r else s.cleaner_point
        size = s.dirty_bytes - (s.cleanable_bytes if r else 0)
        out[s.stream] = [first, s.dirty_end, rows, size, micros(oldest), micros(now)]
    return out


def seen_entries(
    catalog: Catalog, state_name: str, log_seen: int | None, dirty: Mapping[str, list[int]], held: Mapping[str, str]
) -> dict[str, str] | None:
    """What a round with nothing due records, where the state does not hold it yet: the log's
    snapshot it planned against and what it left dirty, with the state's other carried keys
    and `held` (the bytes it records), for a commit of properties alone. A pass then decides
    from them and the log's commits after it, whatever the log's history keeps."""
    state = catalog.load_table(state_name)
    if log_seen is None or LOG_SEEN.read(state) == log_seen:
        return None
    return {**carried_entries(state, "state"), **held, **LOG_SEEN.entry(log_seen), **DIRTY.entry(dict(dirty))}

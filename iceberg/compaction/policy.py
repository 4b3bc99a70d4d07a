"""Compaction planning (pure), with Kafka's scheduling knobs and meanings.

Per stream (`topic:partition`): the cleaner point is the next sequence number not yet
compacted. The cleanable range starts there and ends before the first event younger than
`min_compaction_lag`. A stream is cleaned when its cleanable dirty ratio (cleanable bytes
over clean plus cleanable bytes) reaches `min_cleanable_dirty_ratio`, or when its oldest
dirty event is older than `max_compaction_lag`, or when forced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from connector.core.ordering import Ordering
from iceberg.maintenance import MaintenancePolicy


@dataclass(frozen=True)
class CompactionPolicy:
    ordering: Ordering = "source"
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag: timedelta = timedelta(0)
    max_compaction_lag: timedelta | None = None
    tombstone_retention: timedelta = timedelta(hours=24)
    log_retention: timedelta | None = None  # log rows older than this may go (`log_retention_hours`)
    packed: bool = True  # the packed order key where a round fits (False: always the general route)
    # a round of at most this many events takes the general route with the events' payload, in
    # one job (the packed route reads the log twice: the order columns, then the winners' payload)
    small_round: int = 20_000
    max_new_columns: int = 1_000  # columns one round may add to the state table (`limits.max_new_columns`)
    maintenance: MaintenancePolicy = MaintenancePolicy()  # after each round (`iceberg.maintenance`)


@dataclass(frozen=True)
class StreamStats:
    stream: str
    cleaner_point: int
    clean_bytes: int
    dirty_bytes: int  # all bytes above the cleaner point
    cleanable_bytes: int  # the part older than min_compaction_lag
    cleanable_end: int  # exclusive end of the cleanable range
    first_dirty_time: datetime | None
    dirty_events: int = 0
    last_cleanable_time: datetime | None = None  # the newest enqueued time of the cleanable range
    cleanable_events: int = 0
    young_time: datetime | None = None  # the oldest enqueued time past the cleanable range
    dirty_end: int = 0  # past the last dirty event's sequence number
    # of the cleanable range, when asked for: the packing bounds of its events
    # (`dedupe.bounds_columns`) and how many truncates it holds
    bounds: dict[str, Any] | None = field(default=None, compare=False)
    truncates: int = 0
    # whether its changes come in order (each no older than the one before it in the stream,
    # see `stats.Segment`): if not, some may be stale and only the general route finds them
    monotone: bool = True

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0


@dataclass(frozen=True)
class CleanRange:
    """Sequence numbers [start, end) of one stream, to be compacted in this round."""

    stream: str
    start: int
    end: int

    @property
    def topic(self) -> str:
        return self.stream.rsplit(":", 1)[0]

    @property
    def partition(self) -> int:
        return int(self.stream.rsplit(":", 1)[1])


def plan(stats: list[StreamStats], policy: CompactionPolicy, now: datetime, force: bool = False) -> list[CleanRange]:
    """The ranges to clean now; streams with nothing cleanable or not yet due are left."""
    ranges = []
    for s in stats:
        if s.cleanable_end <= s.cleaner_point:
            continue
        overdue = (
            policy.max_compaction_lag is not None
            and s.first_dirty_time is not None
            and now - s.first_dirty_time >= policy.max_compaction_lag
        )
        if force or overdue or s.dirty_ratio >= policy.min_cleanable_dirty_ratio:
            ranges.append(CleanRange(s.stream, s.cleaner_point, s.cleanable_end))
    return ranges

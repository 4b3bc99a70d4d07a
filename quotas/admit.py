"""The admit decisions (pure): event size, partition count, per-partition bytes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from quotas.errors import QuotaConfigError
from quotas.tiers import TierQuota

REMEDIES = (
    'run `cdclake compact` to reclaim space (or set quotas.policy = "backpressure")',
    "raise the tier or tables.<t>.compacted_bytes_per_partition",
    "then rerun: the refused events are still in the source",
)


def oversized(quota: TierQuota, sizes: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Which events are over the tier's size limit, from their sizes (key + value bytes)."""
    return pc.greater(sizes, quota.max_event_bytes)


def size_detail(quota: TierQuota, size: int) -> str:
    """The dead-letter detail of an event `oversized` refuses."""
    return f"event is {size:,} bytes, over the {quota.name} tier limit of {quota.max_event_bytes:,} bytes"


@dataclass(frozen=True)
class Refusal:
    table: str
    stream: str
    tier: str
    usage: int
    incoming: int
    limit: int
    first_refused: int  # sequence number of the first event not committed

    def message(self) -> str:
        return (
            f"quota exceeded for table {self.table!r} partition {self.stream} (tier {self.tier}): "
            f"{self.usage:,} bytes held + {self.incoming:,} incoming > limit {self.limit:,} bytes; "
            f"events from sequence number {self.first_refused} were not committed. To go on: " + "; ".join(REMEDIES)
        )


def refuse(
    table: str, quota: TierQuota, usage: Mapping[str, int], incoming: Mapping[str, tuple[int, int]]
) -> list[Refusal]:
    """Streams whose usage plus `incoming` (bytes, first sequence number) exceeds the quota."""
    limit = quota.compacted_bytes_per_partition
    if limit is None:
        return []
    return [
        Refusal(table, s, quota.name, usage.get(s, 0), n, limit, first)
        for s, (n, first) in sorted(incoming.items())
        if usage.get(s, 0) + n > limit
    ]


def validate_table(
    table: str,
    quota: TierQuota,
    *,
    compaction: bool,
    partitions: int | None,
    log_retention_hours: float,
    tombstone_retention_hours: float,
) -> None:
    """Raises QuotaConfigError naming the table, the setting, the tier and the limit."""
    problems = []
    if compaction and not quota.compaction_supported:
        problems.append(
            f"compaction is not supported on the {quota.name} tier "
            f"(set tables.{table}.compaction = false or choose standard or above)"
        )
    if partitions is not None and partitions > quota.max_partitions:
        problems.append(
            f"tables.{table}.partitions = {partitions} exceeds the {quota.name} tier limit of "
            f"{quota.max_partitions} partitions"
        )
    if log_retention_hours > quota.max_retention_days * 24:
        problems.append(
            f"log retention {log_retention_hours:g} h exceeds the {quota.name} tier limit of "
            f"{quota.max_retention_days} days"
        )
    if tombstone_retention_hours > log_retention_hours:
        problems.append(
            f"compaction.tombstone_retention_hours = {tombstone_retention_hours:g} is longer than the "
            f"log retention of {log_retention_hours:g} h"
        )
    if problems:
        raise QuotaConfigError(f"table {table!r}: " + "; ".join(problems))

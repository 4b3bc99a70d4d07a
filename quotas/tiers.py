"""Event Hubs tiers and their limits, as data.

Figures from the Event Hubs quotas page: compaction is not available on Basic; the
compacted size per partition is 1 GB on Standard and 250 GB on Premium / Dedicated;
events (and batches) may be 256 KB on Basic and 1 MB elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

KB, MB, GB = 1024, 1024**2, 1024**3


def human_bytes(n: int) -> str:
    """A byte count as a person reads it: `1 GB`, `250 GB`, `256 KB`, `1.5 MB` (1 KB = 1024 B,
    as the Event Hubs quotas state their limits)."""
    for unit, size in (("TB", 1024**4), ("GB", GB), ("MB", MB), ("KB", KB)):
        if abs(n) >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.3g} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class TierQuota:
    name: str
    compaction_supported: bool
    compacted_bytes_per_partition: int | None  # None: no compaction, so no compacted size
    max_event_bytes: int
    max_partitions: int
    max_retention_days: int
    consumer_groups: int

    def with_overrides(self, **overrides: int | None) -> TierQuota:
        """A per-table variant; None values leave the tier's figure."""
        given: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
        return replace(self, **given)


TIERS: dict[str, TierQuota] = {
    "basic": TierQuota("basic", False, None, 256 * KB, 32, 1, 1),
    "standard": TierQuota("standard", True, 1 * GB, 1 * MB, 32, 7, 20),
    "premium": TierQuota("premium", True, 250 * GB, 1 * MB, 100, 90, 100),
    "dedicated": TierQuota("dedicated", True, 250 * GB, 1 * MB, 1024, 90, 1000),
}

"""The quota gate around ingest: tiers resolved per table, usage per partition, pauses.

State is bounded: one entry per (table, partition), and a table may not receive from more
partitions than its tier allows (QuotaConfigError), so at most tables x max_partitions.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quotas.admit import Refusal, refuse, validate_table
from quotas.errors import QuotaConfigError
from quotas.metrics import QUOTA, USAGE
from quotas.tiers import TIERS, TierQuota

if TYPE_CHECKING:
    from connector.core.config import Settings

log = logging.getLogger(__name__)


def tiers(settings: Settings) -> dict[str, TierQuota]:
    custom = {n: TierQuota(n, **c.model_dump()) for n, c in settings.quotas.custom.items()}
    return {**TIERS, **custom}


def table_quota(settings: Settings, table: str) -> TierQuota:
    cfg = settings.table(table)
    name = cfg.tier or settings.quotas.default_tier
    known = tiers(settings)
    if name not in known:
        key = settings.table_key(table, "tier") if cfg.tier else "quotas.default_tier"
        raise QuotaConfigError(f"{key} = {name!r}: unknown tier (known: {sorted(known)}; add one under quotas.custom)")
    return known[name].with_overrides(
        max_event_bytes=cfg.max_event_bytes, compacted_bytes_per_partition=cfg.compacted_bytes_per_partition
    )


def validate(settings: Settings, table: str) -> TierQuota:
    """The table's quota, after checking its settings against the tier."""
    cfg = settings.table(table)
    quota = table_quota(settings, table)
    validate_table(
        table,
        quota,
        compaction=cfg.compaction,
        partitions=cfg.partitions,
        log_retention_hours=cfg.log_retention_hours or settings.compaction.log_retention_hours,
        tombstone_retention_hours=settings.compaction.tombstone_retention_hours,
    )
    return quota


@dataclass
class QuotaGate:
    settings: Settings
    usage: dict[str, dict[str, int]] = field(default_factory=dict)  # table -> stream -> bytes
    paused: dict[tuple[str, str], Refusal] = field(default_factory=dict)
    _quotas: dict[str, TierQuota] = field(default_factory=dict)
    _warned: set[tuple[str, str]] = field(default_factory=set)

    def quota(self, table: str) -> TierQuota:
        if table not in self._quotas:
            self._quotas[table] = validate(self.settings, table)
        return self._quotas[table]

    def admit(self, table: str, incoming: Mapping[str, tuple[int, int]]) -> list[Refusal]:
        """New refusals: streams that would overflow. Paused streams stay paused (see `caps`)."""
        quota = self.quota(table)
        streams = set(self.usage.get(table, {})) | set(incoming)
        if len(streams) > quota.max_partitions:
            raise QuotaConfigError(
                f"table {table!r} receives from {len(streams)} partitions; the {quota.name} "
                f"tier allows {quota.max_partitions}"
            )
        fresh = {s: v for s, v in incoming.items() if (table, s) not in self.paused}
        refusals = refuse(table, quota, self.usage.get(table, {}), fresh)
        for r in refusals:
            self.paused[(table, r.stream)] = r
        return refusals

    def caps(self, table: str) -> dict[str, int]:
        """Positions that must not advance for this table: the first refused event per stream."""
        return {s: r.first_refused for (t, s), r in self.paused.items() if t == table}

    def record(self, table: str, stream: str, nbytes: int) -> None:
        held = self.usage.setdefault(table, {})
        held[stream] = held.get(stream, 0) + nbytes
        self._observe(table, stream)

    def reset(self, usage: dict[str, dict[str, int]]) -> None:
        """New usage figures (after compaction); pauses are lifted and re-decided."""
        self.usage, self.paused = usage, {}
        for table, streams in usage.items():
            for stream in streams:
                self._observe(table, stream)

    def _observe(self, table: str, stream: str) -> None:
        quota = self.quota(table)
        used = self.usage[table][stream]
        USAGE.labels(table, stream).set(used)
        limit = quota.compacted_bytes_per_partition
        if limit is None:
            return
        QUOTA.labels(table, stream).set(limit)
        if used >= self.settings.quotas.soft_threshold * limit and (table, stream) not in self._warned:
            self._warned.add((table, stream))
            log.warning(
                "table %s partition %s uses %s of %s bytes (%.0f%% of the %s tier quota): compact, or raise the tier",
                table,
                stream,
                f"{used:,}",
                f"{limit:,}",
                100 * used / limit,
                quota.name,
            )

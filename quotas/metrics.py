"""Prometheus metrics (prometheus-client's default registry; `cdclake run --metrics-port`)."""

import time
from datetime import datetime

from prometheus_client import Counter, Gauge

USAGE = Gauge(
    "cdclake_partition_usage_bytes",
    "retained bytes (state + tombstones + dirty log) per partition",
    ["table", "stream"],
)
QUOTA = Gauge("cdclake_partition_quota_bytes", "compacted size quota per partition", ["table", "stream"])
REFUSALS = Counter(
    "cdclake_quota_refusals_total", "batches refused for a partition over its quota", ["table", "stream"]
)
DEAD_LETTERS = Counter("cdclake_dead_letters_total", "records sent to dead letters", ["table", "reason"])
EVENTS = Counter("cdclake_events_ingested_total", "events appended to the log tables", ["table"])
STALE = Counter(
    "cdclake_stale_events_total", "events compaction ignored as stale (older than what it held)", ["table", "reason"]
)
MIRROR_FAILURES = Counter(
    "cdclake_position_mirror_failures_total",
    "committed positions not mirrored to the source's tooling (consumer group, blob checkpoint); best effort",
    ["source"],
)
FRESHNESS = Gauge(
    "cdclake_table_freshness_seconds",
    "seconds since the newest event compaction has applied to the table was enqueued",
    ["table"],
)
_NEWEST: dict[str, float] = {}


def compacted_up_to(table: str, enqueued: datetime) -> None:
    """A round of `table` applied events up to one enqueued at `enqueued`: its freshness is
    the time since then, as of each scrape."""
    if enqueued.timestamp() > _NEWEST.get(table, float("-inf")):
        _NEWEST[table] = enqueued.timestamp()
        FRESHNESS.labels(table).set_function(lambda: time.time() - _NEWEST[table])

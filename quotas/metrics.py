"""Prometheus metrics (prometheus-client's default registry; `cdclake run --metrics-port`)."""

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

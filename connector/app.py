"""Orchestration used by the CLI: ingest, compact, status. No printing here."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from pyiceberg.catalog import Catalog

from connector.core.config import Settings
from connector.core.errors import ConnectorError
from connector.core.source_config import FileSourceConfig
from connector.debezium import decoder_for
from connector.pipeline import IngestJob, IngestStats
from connector.sources import load_source
from iceberg import leases
from iceberg.catalog import load_catalog
from iceberg.compaction.policy import CompactionPolicy
from iceberg.compaction.quiet import quota_usage
from iceberg.compaction.stats import load_optional, log_start, stream_stats
from iceberg.layouts import TableNames, source_tables
from iceberg.maintenance import MaintenancePolicy
from quotas.ledger import QuotaGate, table_quota, validate

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from iceberg.compaction.report import CompactionReport

log = logging.getLogger(__name__)


def policy_of(settings: Settings) -> CompactionPolicy:
    c, m = settings.compaction, settings.maintenance
    return CompactionPolicy(
        ordering=c.ordering,
        min_cleanable_dirty_ratio=c.min_cleanable_dirty_ratio,
        min_compaction_lag=timedelta(seconds=c.min_compaction_lag_seconds),
        max_compaction_lag=timedelta(seconds=c.max_compaction_lag_seconds) if c.max_compaction_lag_seconds else None,
        tombstone_retention=timedelta(hours=c.tombstone_retention_hours),
        log_retention=timedelta(hours=c.log_retention_hours),
        max_new_columns=settings.limits.max_new_columns,
        maintenance=MaintenancePolicy(
            snapshot_retention=timedelta(hours=m.snapshot_retention_hours),
            rewrite_files=m.rewrite_files,
            enabled=m.enabled,
            orphan_age=timedelta(hours=m.orphan_age_hours),
        ),
    )


def table_names(settings: Settings, catalog: Catalog, only: list[str] | None = None) -> list[TableNames]:
    names = source_tables([n for _, n in catalog.list_tables(settings.catalog.namespace)])
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            from connector.core.errors import ConfigError

            raise ConfigError(f"--table {unknown}: no such source table (known: {names or 'none yet: ingest first'})")
        names = [n for n in names if n in only]
    return [TableNames(settings.catalog.name, settings.catalog.namespace, n) for n in names]


def load_usage(settings: Settings, catalog: Catalog, tables: list[str] | None = None) -> dict[str, dict[str, int]]:
    """Per table and stream: bytes held in state + tombstones plus dirty bytes in the log
    (`quiet.quota_usage`: no state row is read, nor, mostly, a log row)."""
    return {n.table: quota_usage(catalog, n) for n in table_names(settings, catalog, tables)}


def validate_tables(settings: Settings, catalog: Catalog) -> None:
    """Every table named in the settings and every existing one against its tier (errors name
    table, setting, tier, limit); a table that a glob or [table_defaults] configures is
    checked here once it exists, and by the quota gate when its first events arrive."""
    for table in sorted(set(settings.named_tables()) | {n.table for n in table_names(settings, catalog)}):
        validate(settings, table)


def run_ingest(
    settings: Settings,
    on_batch: Callable[[IngestStats], None] | None = None,
    max_records: int | None = None,
    wait: float = 0.0,
) -> IngestStats:
    """Ingest what the source holds. One ingest per namespace and source at a time: the run
    holds their `ingest` lease (waiting up to `wait` seconds for another holder); a second
    source writing the same table is stopped by the fenced commits (`connector.sinks`)."""
    if isinstance(settings.source, FileSourceConfig) and not settings.source.path:
        from connector.core.errors import ConfigError

        raise ConfigError("source.path: set the replay file (config file or CDCLAKE_SOURCE__PATH)")
    catalog = load_catalog(settings)
    validate_tables(settings, catalog)
    ns, label = settings.catalog.namespace, settings.source.label()
    lease = leases.acquire(catalog, f"{ns} <- {label}", "ingest", wait, what=f"tables {ns}.* from {label}")
    try:
        return _ingest(settings, catalog, lease, on_batch, max_records)
    finally:
        lease.release()


def _ingest(
    settings: Settings,
    catalog: Catalog,
    lease: leases.Lease,
    on_batch: Callable[[IngestStats], None] | None,
    max_records: int | None,
) -> IngestStats:
    gate = QuotaGate(settings)
    gate.reset(load_usage(settings, catalog))

    def make_room(tables: list[str]) -> dict[str, dict[str, int]]:
        run_compaction(settings, tables, force=True)
        return load_usage(settings, catalog)

    backpressure = settings.quotas.policy == "backpressure"
    if settings.compaction.between_batches:
        user_on_batch, compacted = on_batch, dict[str, int]()

        def on_batch(stats: IngestStats) -> None:  # noqa: F811 - wraps the caller's hook
            touched = [t for t, n in stats.accepted.items() if compacted.get(t) != n]
            compacted.update(stats.accepted)
            if touched:
                run_compaction(settings, touched)
            if user_on_batch:
                user_on_batch(stats)

    job = IngestJob(
        catalog, settings.catalog.namespace, decoder_for(settings), settings.source.batch_size, gate, on_batch, lease
    )
    from connector.pipeline import ingest
    from iceberg.spark import get_spark

    with load_source(settings.source) as source:
        return ingest(get_spark(settings), source, job, max_records, make_room if backpressure else None)


def compaction_enabled(settings: Settings, table: str) -> bool:
    return settings.table(table).compaction


def table_policy(settings: Settings, table: str) -> CompactionPolicy:
    """The compaction policy of `table`: the settings', with the table's own log retention."""
    policy, cfg = policy_of(settings), settings.table(table)
    if cfg.log_retention_hours:
        policy = dataclasses.replace(policy, log_retention=timedelta(hours=cfg.log_retention_hours))
    return policy


class RoundsFailed(ConnectorError):
    """Some tables' rounds failed; the others' are committed (`reports`). `failures`: per
    failed table, what it raised."""

    def __init__(self, reports: list[CompactionReport], failures: list[tuple[str, BaseException]]):
        super().__init__("; ".join(f"table {t}: {type(e).__name__}: {e}" for t, e in failures))
        self.reports, self.failures = reports, failures


def run_compaction(
    settings: Settings,
    tables: list[str] | None = None,
    force: bool = False,
    now: datetime | None = None,
    on_table: Callable[[str], None] | None = None,
    wait: float = 0.0,
) -> list[CompactionReport]:
    """One pass over the tables (all, or those named): a table whose commits say it has
    nothing due costs its metadata only; the rounds of the others, the most rows appended since
    their last round first, run `compaction.parallel_tables` at a time, each in a Spark session
    of its own (its own views and snapshot properties) in a fair-scheduler pool of its own,
    the small ones read in shared jobs (`iceberg.compaction.shared`). A table whose round fails
    does not stop the others: `RoundsFailed` after the pass names it, with the others' reports."""
    from iceberg.compaction.quiet import backlog, quiet
    from iceberg.compaction.report import CompactionReport, utc

    catalog = load_catalog(settings)
    now = utc(now or datetime.now(UTC))
    todo = [n for n in table_names(settings, catalog, tables) if compaction_enabled(settings, n.table)]
    for names in todo:
        validate(settings, names.table)
    policies = {n.table: table_policy(settings, n.table) for n in todo}
    reports = {n.table: CompactionReport(n.table, ran=False) for n in todo}
    due = [n for n in todo if not quiet(catalog, n, policies[n.table], now, force)]
    due.sort(key=lambda n: backlog(catalog, n), reverse=True)  # a hot table does not wait behind quiet ones
    failures: list[tuple[str, BaseException]] = []
    if due:
        from iceberg.compaction.shared import compact_tables
        from iceberg.spark import get_spark

        workers = min(settings.compaction.parallel_tables, len(due))
        done, failures = compact_tables(
            get_spark(settings), catalog, [(n, policies[n.table]) for n in due], now, force, wait, workers, on_table
        )
        for report in done:
            reports[report.table] = report
        for state, e in failures:
            log.info("compaction of %s failed: %s: %s", state, type(e).__name__, e)
            del reports[next(n.table for n in due if n.state == state)]
    log.info(
        "compaction pass over %d tables: %d rounds, %d failed, %d with nothing due",
        len(todo),
        len(due),
        len(failures),
        len(todo) - len(due),
    )
    if failures:
        raise RoundsFailed(list(reports.values()), failures)
    return list(reports.values())


@dataclass(frozen=True)
class StreamStatus:
    table: str
    stream: str
    cleaner_point: int
    dirty_events: int
    dirty_bytes: int
    clean_bytes: int
    dirty_ratio: float
    live_rows: int
    tombstones: int
    tier: str
    quota_bytes: int | None
    log_from: int | None = None  # the oldest sequence number the log holds (log retention trims it)
    first_dirty_time: datetime | None = None  # the enqueued time of its oldest uncompacted event
    due: bool = False  # the planner would compact it now (`policy.plan`, not forced)
    compaction: bool = True  # False: a log-only table, never compacted (so never due, never lagging)

    @property
    def usage_bytes(self) -> int:
        return self.clean_bytes + self.dirty_bytes


def _count_by_stream(table: Table | None) -> dict[str, int]:
    if table is None:
        return {}
    rows = table.scan(selected_fields=("_topic", "_partition_id")).to_arrow()
    if rows.num_rows == 0:
        return {}
    g = rows.group_by(["_topic", "_partition_id"]).aggregate([("_topic", "count")])
    return {f"{t}:{p}": n for t, p, n in zip(*(g.column(i).to_pylist() for i in range(3)))}


def matching(tables: list[str], globs: list[str] | None) -> list[str]:
    """The tables whose name matches one of the `fnmatch` globs (case-sensitive), in their
    order; all of them without a glob."""
    from fnmatch import fnmatchcase

    return [t for t in tables if not globs or any(fnmatchcase(t, g) for g in globs)]


def status(settings: Settings, now: datetime | None = None, globs: list[str] | None = None) -> list[StreamStatus]:
    """Per stream of each source table (those matching one of `globs`, see `matching`): its
    figures at `now`, whether the planner would compact it now, and its oldest dirty event.
    Reads metadata and the tables with pyiceberg (no Spark)."""
    from iceberg.compaction.policy import plan

    catalog = load_catalog(settings)
    now = now or datetime.now(UTC)
    every = table_names(settings, catalog)
    chosen = set(matching([n.table for n in every], globs))
    out = []
    for names in [n for n in every if n.table in chosen]:
        quota, policy = table_quota(settings, names.table), table_policy(settings, names.table)
        compacted = compaction_enabled(settings, names.table)
        live = _count_by_stream(load_optional(catalog, names.state))
        dead = _count_by_stream(load_optional(catalog, names.tombstones))
        start = log_start(catalog.load_table(names.log))
        stats = stream_stats(catalog, names, policy, now)
        due = {r.stream for r in plan(stats, policy, now)} if compacted else set()
        for s in stats:
            if s.dirty_events == 0 and s.stream not in live and s.stream not in dead and s.cleaner_point == 0:
                continue  # a stream that feeds other tables
            total = s.clean_bytes + s.dirty_bytes
            out.append(
                StreamStatus(
                    names.table,
                    s.stream,
                    s.cleaner_point,
                    s.dirty_events,
                    s.dirty_bytes,
                    s.clean_bytes,
                    round(s.dirty_bytes / total, 3) if total else 0.0,
                    live.get(s.stream, 0),
                    dead.get(s.stream, 0),
                    quota.name,
                    quota.compacted_bytes_per_partition,
                    start.get(s.stream),
                    s.first_dirty_time,
                    s.stream in due,
                    compacted,
                )
            )
    return out

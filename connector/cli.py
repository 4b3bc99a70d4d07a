"""`cdclake`: Debezium change events into compacted Iceberg tables.

Data flow: a source (a kcat -J replay file today) -> `ingest` appends every accepted
event to `<ns>.<table>__log` (bad input to `<ns>.<table>__dead_letters`) -> `compact`
runs the Spark cleaner that keeps the newest change per key in `<ns>.<table>` and
deletes in `<ns>.<table>__tombstones` for `tombstone_retention_hours`.
"""

from __future__ import annotations

import logging
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from connector.config import Settings, load_settings
from connector.errors import ConfigError, ConnectorError, SetupError

app = typer.Typer(help=__doc__, no_args_is_help=True, rich_markup_mode="markdown", add_completion=False)
console = Console()
PROGRESS_EVERY_S = 10.0  # progress lines when the output is not a terminal (CI, log files)

ConfigOpt = typer.Option(None, "--config", "-c", envvar="CDCLAKE_CONFIG",
                         help="TOML config file; CDCLAKE_* environment variables override it "
                              "(e.g. CDCLAKE_SOURCE__PATH=dump.jsonl).")


def _settings(config: Optional[Path], **overrides) -> Settings:
    try:
        return load_settings(config, **overrides)
    except ConnectorError as e:
        console.print("[red]error:[/red]", Text(str(e)), soft_wrap=True)
        raise typer.Exit(2) from None


class QueryError(ConnectorError):
    """A query Spark refused (syntax, unknown table or column)."""


def _guard(fn):
    """Turn ConnectorErrors into one clear line: exit code 2 for configuration and set-up
    errors (fix the configuration), 1 for the rest."""
    try:
        return fn()
    except (ConfigError, SetupError) as e:
        console.print("[red]error:[/red]", Text(str(e)), soft_wrap=True)
        raise typer.Exit(2) from None
    except ConnectorError as e:
        console.print("[red]error:[/red]", Text(str(e)), soft_wrap=True)
        raise typer.Exit(1) from None


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v", help="log every commit and decision")) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not console.is_terminal:  # no spinner in a log file: the compaction steps are the progress
        logging.getLogger("iceberg.compaction.job").setLevel(logging.INFO)


def _do_ingest(settings: Settings, max_records: Optional[int] = None):
    from connector.app import run_ingest

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task("ingesting", total=None)
        started = last_line = time.monotonic()

        def on_batch(stats):
            nonlocal last_line
            now = time.monotonic()
            line = (f"ingesting: {stats.records:,} records in {stats.batches} batches "
                    f"({stats.records / max(now - started, 1e-9):,.0f}/s), "
                    f"{sum(stats.dead_letters.values()):,} dead letters")
            progress.update(task, description=line)
            if not console.is_terminal and now - last_line >= PROGRESS_EVERY_S:  # logs get a line, not a spinner
                console.print(line)
                last_line = now

        stats = run_ingest(settings, on_batch, max_records)
    table = Table("table", "accepted", "dead letters", title=f"ingested {stats.records:,} records "
                  f"({stats.duplicates:,} already held, skipped)")
    for name in sorted(set(stats.accepted) | set(stats.dead_letters)):
        table.add_row(name, f"{stats.accepted.get(name, 0):,}", f"{stats.dead_letters.get(name, 0):,}")
    console.print(table)
    return stats


def _do_compact(settings: Settings, tables: Optional[list[str]], force: bool, now: Optional[datetime] = None):
    from connector.app import run_compaction

    with console.status("starting Spark") as st:
        reports = run_compaction(settings, tables, force, now,
                                 on_table=lambda t: st.update(f"compacting {t}"))
    table = Table("table", "streams", "events", "keys", "upserts", "deletes", "stale", "truncates", "dead letters",
                  "purged", "maintenance", "seconds", title="compaction")
    for r in reports:
        stale = "\n".join(f"{n:,} {reason}" for reason, n in sorted(r.stale_reasons.items())) or "0"
        truncates = f"{r.truncates} ({r.truncated:,} keys)" if r.truncates else "0"
        table.add_row(r.table, str(len(r.ranges)), f"{r.events:,}", f"{r.keys:,}", f"{r.upserts:,}",
                      f"{r.deletes:,}", stale, truncates, f"{r.refused:,}", f"{r.purged:,}",
                      "\n".join(r.maintenance) or "-", f"{r.seconds:.1f}")
    console.print(table)
    return reports


@app.command()
def ingest(config: Optional[Path] = ConfigOpt,
           max_records: Optional[int] = typer.Option(None, help="stop after this many records")) -> None:
    """Read the source from the committed positions and append to the log tables (exactly once)."""
    settings = _settings(config)
    _guard(lambda: _do_ingest(settings, max_records))


@app.command()
def compact(config: Optional[Path] = ConfigOpt,
            table: Optional[list[str]] = typer.Option(None, "--table", "-t", help="only this source table (repeat)"),
            force: bool = typer.Option(False, help="clean every cleanable range, ignoring min_cleanable_dirty_ratio"),
            ) -> None:
    """Run the Spark cleaner on the tables whose dirty ratio (or max_compaction_lag) makes them due,
    then rewrite small files (the log's manifests) and expire old snapshots where due ([maintenance])."""
    settings = _settings(config)
    _guard(lambda: _do_compact(settings, table, force))


@app.command()
def run(config: Optional[Path] = ConfigOpt,
        every: Optional[float] = typer.Option(None, help="repeat ingest + compact every N seconds until Ctrl-C"),
        force: bool = typer.Option(False, help="compact regardless of the dirty ratio"),
        metrics_port: Optional[int] = typer.Option(None, help="serve Prometheus metrics on 127.0.0.1:PORT")) -> None:
    """Ingest then compact, once (default) or repeatedly with --every."""
    settings = _settings(config)
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr="127.0.0.1")
    while True:
        _guard(lambda: _do_ingest(settings))
        _guard(lambda: _do_compact(settings, None, force))
        if every is None:
            return
        time.sleep(every)


def _print_status(settings: Settings) -> None:
    from connector.app import status as get_status

    rows = get_status(settings)
    table = Table("table", "stream", "cleaner point", "dirty events", "dirty bytes", "clean bytes", "dirty ratio",
                  "live rows", "tombstones", "usage / quota", title="status")
    for s in rows:
        table.add_row(s.table, s.stream, f"{s.cleaner_point:,}", f"{s.dirty_events:,}", f"{s.dirty_bytes:,}",
                      f"{s.clean_bytes:,}", f"{s.dirty_ratio:.2f}", f"{s.live_rows:,}", f"{s.tombstones:,}",
                      _usage(s.usage_bytes, s.quota_bytes, s.tier))
    console.print(table)


def _usage(used: int, limit: int | None, tier: str) -> str:
    if limit is None:
        return f"{used:,} B ({tier}: no compacted quota)"
    return f"{100 * used / limit:.4g}% of {limit:,} B ({tier})"


def _print_quotas(settings: Settings) -> None:
    from connector.app import status as get_status
    from quotas.ledger import tiers

    table = Table("tier", "compaction", "compacted size / partition", "max event", "max partitions",
                  "max retention (days)", "consumer groups", title="tiers")
    for q in tiers(settings).values():
        table.add_row(q.name, "yes" if q.compaction_supported else "no",
                      f"{q.compacted_bytes_per_partition:,} B" if q.compacted_bytes_per_partition else "-",
                      f"{q.max_event_bytes:,} B", str(q.max_partitions), str(q.max_retention_days),
                      str(q.consumer_groups))
    console.print(table)
    usage = Table("table", "stream", "tier", "usage", "quota", title="usage per partition (state + tombstones + "
                  "dirty log, key + payload bytes)")
    for s in get_status(settings):
        usage.add_row(s.table, s.stream, s.tier, f"{s.usage_bytes:,} B", _usage(s.usage_bytes, s.quota_bytes, s.tier))
    console.print(usage)


@app.command()
def status(config: Optional[Path] = ConfigOpt) -> None:
    """Per table and stream: cleaner point, dirty ratio, live rows, tombstones, bytes (no Spark needed)."""
    settings = _settings(config)
    _guard(lambda: _print_status(settings))


@app.command()
def quotas(config: Optional[Path] = ConfigOpt) -> None:
    """The Event Hubs tiers (and custom ones) and each table's usage per partition against its tier."""
    settings = _settings(config)
    _guard(lambda: _print_quotas(settings))


def _print_query(settings: Settings, sql: str, limit: int) -> None:
    from pyspark.errors import PySparkException

    from iceberg.spark import get_spark

    try:
        df = get_spark(settings).sql(sql)
        rows = df.limit(limit).collect()
    except PySparkException as e:  # Spark's own message, first line: no JVM stack trace
        raise QueryError(f"query failed: {str(e).strip().splitlines()[0]}") from None
    table = Table(*df.columns, title=sql)
    for r in rows:
        table.add_row(*["" if v is None else str(v) for v in r])
    console.print(table)


@app.command()
def query(sql: str = typer.Argument(..., help="Spark SQL, e.g. \"SELECT * FROM cdc.customers\""),
          config: Optional[Path] = ConfigOpt, limit: int = typer.Option(50, help="rows to print")) -> None:
    """Run Spark SQL over the tables (catalog is the default catalog; name tables as <ns>.<table>)."""
    settings = _settings(config)
    _guard(lambda: _print_query(settings, sql, limit))


@app.command()
def demo(work_dir: Path = typer.Option(Path(".cdclake/demo"), help="fresh directory for the demo's catalog")) -> None:
    """The main job on the embedded default: a Debezium stream of three tables through ingest and compaction."""
    from connector.demo import LATE_EVENTS, write_demo_file

    started = time.monotonic()
    if work_dir.exists():
        shutil.rmtree(work_dir)
    events = write_demo_file(work_dir / "events.jsonl")
    settings = _settings(None, work_dir=work_dir, source={"type": "file", "path": str(events)},
                         compaction={"min_compaction_lag_seconds": 0})
    total = len(events.read_text().splitlines())
    for step, (records, what) in enumerate([(total - LATE_EVENTS, "the stream"),
                                            (None, f"{LATE_EVENTS} late events older than what is held")], 1):
        console.rule(f"[bold]round {step}: ingest {what}, then compact[/bold]")
        _guard(lambda records=records: _do_ingest(settings, records))
        _guard(lambda: _do_compact(settings, None, force=True, now=datetime.now(timezone.utc)))
    console.rule("[bold]tables[/bold]")
    ns = settings.catalog.namespace
    for t in ("customers", "orders", "products"):
        _guard(lambda t=t: _print_query(settings, f"SELECT * EXCEPT (_topic, _sequence_number, _enqueued_time, _source_ts, "
                                                  f"_payload_bytes, _snapshot) "
                                                  f"FROM {ns}.{t} ORDER BY _key", 50))
    _guard(lambda: _print_query(settings, "SELECT 'customers' AS tbl, _key, _offset, _partition_id, expires_at FROM "
                                          f"{ns}.customers__tombstones UNION ALL SELECT 'orders', _key, _offset, "
                                          f"_partition_id, expires_at FROM {ns}.orders__tombstones", 50))
    _guard(lambda: _print_query(settings, f"SELECT topic, partition, offset, reason, detail FROM "
                                          f"{ns}.products__dead_letters", 50))
    console.rule("[bold]status[/bold]")
    _guard(lambda: _print_status(settings))
    _guard(lambda: _print_quotas(settings))
    console.print(f"demo finished in {time.monotonic() - started:.1f}s; catalog {settings.catalog_uri}")


if __name__ == "__main__":
    app()

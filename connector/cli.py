"""`cdclake`: Debezium change events into compacted Iceberg tables.

Data flow: a source (Kafka, Event Hubs over AMQP or its Kafka endpoint, or a kcat -J dump)
-> `ingest` appends every accepted event to `<ns>.<table>__log` (bad input to
`<ns>.<table>__dead_letters`) -> `compact` runs the Spark cleaner that keeps the newest
change per key in `<ns>.<table>` and deletes in `<ns>.<table>__tombstones` for
`tombstone_retention_hours`.

Try it: `cdclake demo`. Then, with your own configuration: `cdclake run -c lake.toml`.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from connector.core import failures
from connector.core.config import Settings, load_settings
from connector.core.errors import ConfigError, ConnectorError, SetupError
from connector.report import console, print_compaction, print_ingest, print_query, print_quotas, print_status

if TYPE_CHECKING:
    from connector.pipeline import IngestStats
    from iceberg.compaction.report import CompactionReport

T = TypeVar("T")

app = typer.Typer(help=__doc__, no_args_is_help=True, rich_markup_mode="markdown", add_completion=False)
PROGRESS_EVERY_S = 10.0  # progress lines when the output is not a terminal (CI, log files)

ConfigOpt = typer.Option(
    None,
    "--config",
    "-c",
    envvar="CDCLAKE_CONFIG",
    help="TOML config file; CDCLAKE_* environment variables override it (e.g. CDCLAKE_SOURCE__PATH=dump.jsonl).",
)
WaitOpt = typer.Option(
    0.0,
    help="seconds to wait for another process doing the same work (compacting the table, ingesting "
    "the source) to finish (default: stop at once)",
)


def _settings(config: Path | None, **overrides: Any) -> Settings:
    try:
        return load_settings(config, **overrides)
    except ConnectorError as e:
        console.print("[red]error:[/red]", Text(str(e)), soft_wrap=True)
        raise typer.Exit(2) from None


def _guard(fn: Callable[[], T]) -> T:
    """Turn ConnectorErrors and the environment's known faults (`core.failures`) into one
    clear line: exit code 2 for configuration and set-up errors (fix the configuration), 1
    for the rest. Anything else is a bug: its trace is shown."""
    try:
        return fn()
    except (ConfigError, SetupError) as e:
        console.print("[red]error:[/red]", Text(str(e)), soft_wrap=True)
        raise typer.Exit(2) from None
    except ConnectorError as e:
        console.print("[red]error:[/red]", Text(str(e)), soft_wrap=True)
        raise typer.Exit(1) from None
    except typer.Exit:
        raise  # said already
    except Exception as e:
        line = failures.describe(e)
        if line is None:
            raise
        console.print("[red]error:[/red]", Text(line), soft_wrap=True)
        raise typer.Exit(1) from None


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v", help="log every commit and decision")) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not verbose:  # librdkafka's retries while a broker is away: the error says it once
        logging.getLogger("librdkafka").setLevel(logging.CRITICAL)


def _do_ingest(
    settings: Settings, max_records: int | None = None, wait: float = 0.0, stop: threading.Event | None = None
) -> IngestStats:
    """`stop`: once set, the run ends after the batch it is committing (`service.Stopped`)."""
    from connector.app import run_ingest

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=True
    ) as progress:
        task = progress.add_task("ingesting", total=None)
        started = last_line = time.monotonic()

        def on_batch(stats: IngestStats) -> None:
            nonlocal last_line
            now = time.monotonic()
            line = (
                f"ingesting: {stats.records:,} records in {stats.batches} batches "
                f"({stats.records / max(now - started, 1e-9):,.0f}/s), "
                f"{sum(stats.dead_letters.values()):,} dead letters"
            )
            progress.update(task, description=line)
            if not console.is_terminal and now - last_line >= PROGRESS_EVERY_S:  # logs get a line, not a spinner
                console.print(line)
                last_line = now
            if stop is not None and stop.is_set():
                from connector.service import Stopped

                raise Stopped

        stats = run_ingest(settings, on_batch, max_records, wait)
    print_ingest(stats)
    return stats


def _do_compact(
    settings: Settings, tables: list[str] | None, force: bool, now: datetime | None = None, wait: float = 0.0
) -> list[CompactionReport]:
    from connector.app import RoundsFailed, run_compaction

    try:
        with console.status("starting Spark") as st:
            reports = run_compaction(
                settings, tables, force, now, on_table=lambda t: st.update(f"compacting {t}"), wait=wait
            )
    except RoundsFailed as e:  # the other tables' rounds are committed: their figures, then a line per failure
        print_compaction(e.reports)
        for table, error in e.failures:
            line = str(error) if isinstance(error, ConnectorError) else failures.describe(error)
            if line is None:
                raise error from None  # a bug: its trace
            line = line if table in line else f"table {table}: {line}"
            console.print("[red]error:[/red]", Text(line), soft_wrap=True)
        raise typer.Exit(1) from None
    print_compaction(reports)
    return reports


@app.command()
def ingest(
    config: Path | None = ConfigOpt,
    max_records: int | None = typer.Option(None, help="stop after this many records"),
    wait: float = WaitOpt,
) -> None:
    """Read the source from the committed positions and append to the log tables (exactly once).
    One ingest per source and namespace at a time: while another process ingests the same
    source, this one stops with a line naming that process, unless --wait gives it time to finish.

    Example: `cdclake ingest -c lake.toml --max-records 100000 --wait 120`"""
    settings = _settings(config)
    _guard(lambda: _do_ingest(settings, max_records, wait))


@app.command()
def compact(
    config: Path | None = ConfigOpt,
    table: list[str] | None = typer.Option(None, "--table", "-t", help="only this source table (repeat)"),
    force: bool = typer.Option(False, help="clean every cleanable range, ignoring min_cleanable_dirty_ratio"),
    wait: float = WaitOpt,
) -> None:
    """Run the Spark cleaner on the tables whose dirty ratio (or max_compaction_lag) makes them due,
    then rewrite small files (the log's manifests) and expire old snapshots where due (`[maintenance]`).
    One compaction per table at a time: a table another process is compacting stops this one
    with a line naming that process, unless --wait gives it time to finish.

    Example: `cdclake compact -c lake.toml --table orders --force --wait 300`"""
    settings = _settings(config)
    _guard(lambda: _do_compact(settings, table, force, wait=wait))


@app.command()
def run(
    config: Path | None = ConfigOpt,
    every: float | None = typer.Option(None, help="repeat ingest + compact every N seconds until SIGTERM / Ctrl-C"),
    force: bool = typer.Option(False, help="compact regardless of the dirty ratio"),
    metrics_port: int | None = typer.Option(None, help="serve Prometheus metrics and /ready on this port"),
    metrics_host: str = typer.Option("127.0.0.1", help="address of the metrics port (0.0.0.0 in a pod)"),
    wait: float = WaitOpt,
) -> None:
    """Ingest then compact, once (default) or repeatedly with --every. With --every the job stays
    up: a round that fails for a reason that may pass (a broker or store away, a lease held
    elsewhere) is retried with a backoff doubling up to 5 minutes, said in one line and counted
    in `cdclake_round_failures_total`; a configuration error stops it. SIGTERM ends it after the
    batch or round under way, exit 0. `/ready` on the metrics port: 200 while rounds succeed.

    Example: `cdclake run -c lake.toml --every 60 --metrics-port 9108 --metrics-host 0.0.0.0`"""
    from connector import service

    settings = _settings(config)
    ready = threading.Event()
    if metrics_port:
        service.serve(metrics_port, metrics_host, ready)
    if every is None:
        _guard(lambda: _do_ingest(settings, wait=wait))
        _guard(lambda: _do_compact(settings, None, force, wait=wait))
        return
    stop = service.stop_on_signals()

    def one_round() -> None:
        _do_ingest(settings, wait=wait, stop=stop)
        if stop.is_set():
            raise service.Stopped
        _do_compact(settings, None, force, wait=wait)

    def notice(line: str) -> None:
        console.print("[yellow]warning:[/yellow]", Text(line), soft_wrap=True)

    _guard(lambda: service.run_forever(every, one_round, stop, ready, notice))
    console.print("stopped: the last batch and round are committed")


JsonOpt = typer.Option(False, "--json", help="print JSON for scripts instead of a table")


StreamsOpt = typer.Option(False, "--streams", help="a line per stream (partition) instead of per table")
GlobOpt = typer.Option(
    None, "--table", "-t", help="only the source tables matching this glob, e.g. 'inventory_*' (repeat for more)"
)


@app.command()
def status(
    config: Path | None = ConfigOpt,
    as_json: bool = JsonOpt,
    streams: bool = StreamsOpt,
    table: list[str] | None = GlobOpt,
) -> None:
    """A line per table: its dirty events, and of its partitions the highest dirty ratio, the lag
    (the age of the oldest dirty event, `-` when none) and the fullest one's usage of its quota;
    per stream with --streams (log start, cleaner point, rows, tombstones). Then a summary:
    `N tables, D due, L lagging`, where due is a table the planner would compact now and
    lagging one whose oldest dirty event is as old as `compaction.max_compaction_lag_seconds`
    or older (15 minutes where that is unset). No Spark needed.

    Examples: `cdclake status -c lake.toml`, `cdclake status -c lake.toml --table 'inventory_*'`,
    `cdclake status -c lake.toml --streams -t orders`, `cdclake status -c lake.toml --json`
    (per stream, every figure)"""
    settings = _settings(config)
    _guard(lambda: print_status(settings, as_json, streams, table))


@app.command()
def quotas(
    config: Path | None = ConfigOpt,
    as_json: bool = JsonOpt,
    streams: bool = StreamsOpt,
    table: list[str] | None = GlobOpt,
) -> None:
    """The Event Hubs tiers (and custom ones), then a line per table: its tier, partitions and its
    fullest partition's usage against the tier; per partition with --streams.

    Examples: `cdclake quotas -c lake.toml`, `cdclake quotas -c lake.toml --streams -t 'inventory_*'`"""
    settings = _settings(config)
    _guard(lambda: print_quotas(settings, as_json, streams, table))


infra = typer.Typer(help="Definitions of the services the connector reads from, made from its configuration.")
app.add_typer(infra, name="infra")


@infra.command("eventhubs")
def infra_eventhubs(
    config: Path | None = ConfigOpt,
    partitions: int = typer.Option(4, min=1, help="partitions of a hub whose table sets none"),
    out: Path | None = typer.Option(None, "--out", "-o", help="write the template here (default: stdout)"),
) -> None:
    """An ARM template for the Event Hubs namespace and one event hub per source topic: SKU from
    the tables' tier, partitions, compaction (`cleanupPolicy = Compact`) with the tombstone
    retention, the consumer group. Every table is checked against its tier first.

    Example: `cdclake infra eventhubs -c lake.toml -o eventhubs.json`, then
    `az deployment group create -g RG --template-file eventhubs.json --parameters namespaceName=NAME`"""
    from quotas.eventhubs_template import template

    settings = _settings(config)
    text = _guard(lambda: json.dumps(template(settings, partitions), indent=2))
    if out is None:
        print(text)
    else:
        out.write_text(text + "\n")
        console.print(f"wrote {out}")


@app.command()
def query(
    sql: str = typer.Argument(..., help='SQL, e.g. "SELECT * FROM cdc.customers"'),
    config: Path | None = ConfigOpt,
    limit: int = typer.Option(50, help="rows to print"),
    engine: str = typer.Option("spark", help="spark, or duckdb: DuckDB's own Iceberg reader, no JVM"),
) -> None:
    """Run SQL over the tables: name them `<namespace>.<table>`. On Spark (the default) every
    table of the catalog is there; on DuckDB, those the query names.

    Examples:
    `cdclake query "SELECT reason, count(*) FROM cdc.orders__stale GROUP BY reason"`;
    `cdclake query --engine duckdb "SELECT count(*) FROM cdc.customers"`"""
    settings = _settings(config)
    _guard(lambda: print_query(settings, sql, limit, engine))


@app.command()
def read(
    table: str = typer.Argument(..., help="source table, e.g. customers"),
    config: Path | None = ConfigOpt,
    partition: int | None = typer.Option(None, help="only this partition"),
    from_offset: int | None = typer.Option(None, help="from this offset on (within each partition read)"),
    as_of: int | None = typer.Option(None, help="as of this snapshot id of the state table"),
    fmt: str = typer.Option("jsonl", "--format", help="jsonl (one event per line) or table"),
    limit: int | None = typer.Option(None, help="at most this many events"),
) -> None:
    """What a consumer of the compacted event hub reads: each live key's latest event, each live
    tombstone (value null), then the events compaction has not reached yet, by partition and
    offset, with the original value bytes (as text, or `value_base64` where not UTF-8).

    Example: `cdclake read customers -c lake.toml --partition 0 --from-offset 1200 | head`"""
    settings = _settings(config)
    from connector.operate import print_read

    _guard(lambda: print_read(settings, table, partition, from_offset, as_of, fmt, limit))


@app.command("history")
def history_command(
    table: str = typer.Argument(..., help="source table, e.g. customers"),
    config: Path | None = ConfigOpt,
    key: str | None = typer.Option(None, help='only this key, as the log keeps it, e.g. {"id":7}'),
    write: bool = typer.Option(False, "--write", help="(re)write the table <ns>.<table>__history instead"),
    limit: int = typer.Option(100, help="versions to print"),
) -> None:
    """Every version of each key (SCD type 2) from the log, within its retention: the op, the
    after-image, `valid_from` / `valid_to` by the ordering rule, a deleted key ending with its
    deleting event. Stale events are not versions.

    Example: `cdclake history customers -c lake.toml --key '{"id":1004}'`, or `--write` for
    `SELECT * FROM cdc.customers__history` in `cdclake query` or any Iceberg reader"""
    settings = _settings(config)
    from connector.operate import print_history

    _guard(lambda: print_history(settings, table, key, write, limit))


@app.command()
def verify(
    table: str = typer.Argument(..., help="source table, e.g. customers"),
    config: Path | None = ConfigOpt,
) -> None:
    """Recompute the table's state and tombstones from its log (a full compaction into scratch
    tables, dropped afterwards) and compare them with the tables, key by key: `missing`,
    `extra`, `different offset`, `different row`. Exit code 1 on any difference.

    Example: `cdclake verify orders -c lake.toml`"""
    settings = _settings(config)
    from connector.operate import verify_or_rebuild

    report = _guard(lambda: verify_or_rebuild(settings, table))
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def rebuild(
    table: str = typer.Argument(..., help="source table, e.g. customers"),
    config: Path | None = ConfigOpt,
    wait: float = WaitOpt,
) -> None:
    """Recompute the table's state and tombstones from its log and put them in place of the
    tables' (after a corruption, or for a changed ordering rule), with the cleaner points.
    Each table is replaced in one snapshot; the table's compaction waits meanwhile.

    Example: `cdclake rebuild orders -c lake.toml`, then `cdclake verify orders -c lake.toml`"""
    settings = _settings(config)
    from connector.operate import verify_or_rebuild

    _guard(lambda: verify_or_rebuild(settings, table, rebuild=True, wait=wait))


@app.command()
def demo(work_dir: Path = typer.Option(Path(".cdclake/demo"), help="fresh directory for the demo's catalog")) -> None:
    """The main job on the embedded default: a Debezium stream of three tables through ingest and compaction.

    Example: `cdclake demo --work-dir /tmp/cdclake-demo`"""
    from connector.demo import LATE_EVENTS, write_demo_file
    from iceberg.spark import get_spark

    started = time.monotonic()
    if work_dir.exists():
        shutil.rmtree(work_dir)
    # enqueued an hour ago: within the log retention, so the demo's log keeps every event
    events = write_demo_file(work_dir / "events.jsonl", int(time.time() * 1000) - 3_600_000)
    config = work_dir / "cdclake.toml"  # left behind: every command runs on the demo's tables with -c
    config.write_text(
        f"work_dir = {json.dumps(str(work_dir.resolve()))}\n"
        f'[source]\ntype = "file"\npath = {json.dumps(str(events.resolve()))}\n'
        "[compaction]\nmin_compaction_lag_seconds = 0\n"
    )
    settings = _settings(config)
    total = len(events.read_text().splitlines())
    for step, (records, what) in enumerate(
        [(total - LATE_EVENTS, "the stream"), (None, f"{LATE_EVENTS} late events older than what is held")], 1
    ):
        console.rule(f"[bold]round {step}: ingest {what}, then compact[/bold]")
        _guard(partial(_do_ingest, settings, records))
        _guard(lambda: _do_compact(settings, None, force=True, now=datetime.now(UTC)))
    console.rule("[bold]tables[/bold]")
    ns = settings.catalog.namespace
    meta = "_key AS key, _partition_id AS part, _offset AS offset, _op AS op"
    for t, columns in (
        ("customers", "_source_position AS position, name, email"),
        ("orders", "_source_position AS position, status, total"),
        ("products", "name, weight"),
    ):
        _guard(partial(print_query, settings, f"SELECT {meta}, {columns} FROM {ns}.{t} ORDER BY _key", 50))
    expires = "date_format(expires_at, 'yyyy-MM-dd HH:mm') AS expires"
    _guard(
        lambda: print_query(
            settings,
            f"SELECT 'customers' AS table, {meta}, {expires} FROM {ns}.customers__tombstones "
            f"UNION ALL SELECT 'orders', {meta}, {expires} FROM {ns}.orders__tombstones",
            50,
        )
    )
    dead = f"SELECT topic, partition, offset, reason, detail FROM {ns}.products__dead_letters"
    console.print(Text(dead, style="bold"), soft_wrap=True)
    for r in _guard(lambda: get_spark(settings).sql(dead).collect()):
        console.print(Text(f"{r.topic}:{r.partition} offset {r.offset}: {r.reason}: {r.detail}"), soft_wrap=True)
    console.rule("[bold]status[/bold]")
    _guard(lambda: print_status(settings))
    _guard(lambda: print_quotas(settings))
    console.print(f"demo finished in {time.monotonic() - started:.1f}s; catalog {settings.catalog_uri}", soft_wrap=True)
    console.print(
        f"its configuration is {config}: try `cdclake status -c {config}`, `cdclake read customers -c {config}`, "
        f'`cdclake query -c {config} "SELECT * FROM cdc.orders"`',
        soft_wrap=True,
    )


if __name__ == "__main__":
    app()

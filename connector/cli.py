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
import threading
from pathlib import Path

import typer
from rich.text import Text

from connector import demo, operate
from connector.commands import ConfigOpt, WaitOpt, guard, settings_of, show_compaction, show_ingest
from connector.report import console

app = typer.Typer(help=__doc__, no_args_is_help=True, rich_markup_mode="markdown", add_completion=False)


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v", help="log every commit and decision")) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not verbose:  # librdkafka's retries while a broker is away: the error says it once
        logging.getLogger("librdkafka").setLevel(logging.CRITICAL)
    from iceberg.spark import short_lived

    short_lived()  # one command, then the process exits (`run --every` says otherwise)


@app.command()
def ingest(
    config: Path | None = ConfigOpt,
    max_records: int | None = typer.Option(
        None, help="stop after this many new records (those held already are not counted)"
    ),
    wait: float = WaitOpt,
) -> None:
    """Read the source from the committed positions and append to the log tables (exactly once).
    One ingest per source and namespace at a time: while another process ingests the same
    source, this one stops with a line naming that process, unless --wait gives it time to finish.

    Example: `cdclake ingest -c lake.toml --max-records 100000 --wait 120`"""
    settings = settings_of(config)
    guard(lambda: show_ingest(settings, max_records, wait))


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
    settings = settings_of(config)
    guard(lambda: show_compaction(settings, table, force, wait=wait))


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
    from iceberg.spark import short_lived

    short_lived(every is None)  # a job that stays up keeps the JVM's optimizing compiler
    settings = settings_of(config)
    ready = threading.Event()
    if metrics_port:
        service.serve(metrics_port, metrics_host, ready)
    if every is None:
        guard(lambda: show_ingest(settings, wait=wait))
        guard(lambda: show_compaction(settings, None, force, wait=wait))
        return
    stop = service.stop_on_signals()

    def one_round() -> None:
        show_ingest(settings, wait=wait, stop=stop)
        if stop.is_set():
            raise service.Stopped
        show_compaction(settings, None, force, wait=wait)

    def notice(line: str) -> None:
        console.print("[yellow]warning:[/yellow]", Text(line), soft_wrap=True)

    guard(lambda: service.run_forever(every, one_round, stop, ready, notice))
    console.print("stopped: the last batch and round are committed")


infra = typer.Typer(help="Definitions of the services the connector reads from, made from its configuration.")


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

    settings = settings_of(config)
    text = guard(lambda: json.dumps(template(settings, partitions), indent=2))
    if out is None:
        print(text)
    else:
        out.write_text(text + "\n")
        console.print(f"wrote {out}")


# the operating commands (connector/operate.py) and the demo (connector/demo.py), in --help's order
app.command()(operate.status)
app.command()(operate.quotas)
app.add_typer(infra, name="infra")
app.command()(operate.query)
app.command()(operate.read)
app.command("history")(operate.history_command)
app.command()(operate.verify)
app.command()(operate.rebuild)
app.command()(demo.demo)

if __name__ == "__main__":
    app()

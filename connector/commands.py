"""What every command of the CLI shares: its options, reading the settings, one clear line
for an error, and ingest and compaction with their progress and results shown."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from connector.core import failures
from connector.core.config import Settings, load_settings
from connector.core.errors import ConfigError, ConnectorError, SetupError
from connector.report import console, print_compaction, print_ingest

if TYPE_CHECKING:
    from connector.pipeline import IngestStats
    from iceberg.compaction.report import CompactionReport

T = TypeVar("T")

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


def settings_of(config: Path | None, **overrides: Any) -> Settings:
    try:
        return load_settings(config, **overrides)
    except ConnectorError as e:
        console.print("[red]error:[/red]", Text(str(e)), soft_wrap=True)
        raise typer.Exit(2) from None


def guard(fn: Callable[[], T]) -> T:
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


JsonOpt = typer.Option(False, "--json", help="print JSON for scripts instead of a table")


StreamsOpt = typer.Option(False, "--streams", help="a line per stream (partition) instead of per table")
GlobOpt = typer.Option(
    None, "--table", "-t", help="only the source tables matching this glob, e.g. 'inventory_*' (repeat for more)"
)


def show_ingest(
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


def show_compaction(
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

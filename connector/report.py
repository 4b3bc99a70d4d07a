"""What the CLI prints: tables that never cut a word (a plain `column: value` layout where
they do not fit), JSON for scripts, and the reports of ingest, compaction, status, quotas
and queries. Sizes and shares read as a person says them (`1.2 KB of 1 GB`, `<0.01%`)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from connector.core.errors import ConfigError, ConnectorError
from quotas.tiers import human_bytes

if TYPE_CHECKING:
    from connector.app import StreamStatus
    from connector.core.config import Settings

console = Console()
T = TypeVar("T")
NUMBER = re.compile(r"-?[\d,]+(\.\d+)?( [KMGT]?B)?|-|(\d+[dhm] )?\d+[hms]")  # 1,234  1.5 KB  4m 10s


class QueryError(ConnectorError):
    """A query Spark refused (syntax, unknown table or column)."""


class CellTable(Table):
    """A table that keeps its cells as text, so that `show` can print each row as `column:
    value` lines where the table would not fit the console without wrapping a cell."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cells: list[list[str]] = []

    def add_row(self, *cells: Any, **kwargs: Any) -> None:
        super().add_row(*cells, **kwargs)
        self.cells.append([str(c) for c in cells])


def show(table: Table) -> None:
    """The table's title on a line of its own (never wrapped to the table's width), then the
    table where it fits the console with every cell on one line, else its rows as `column:
    value` lines (a narrow terminal, a log)."""
    title, table.title = str(table.title or ""), None
    console.print(Text(title, style="bold"), soft_wrap=True)
    rows = table.cells if isinstance(table, CellTable) else []
    for i, column in enumerate(table.columns):  # figures right-aligned, text left
        column.justify = "right" if rows and all(NUMBER.fullmatch(row[i]) for row in rows) else "left"
    if Measurement.get(console, console.options.update(max_width=1 << 16), table).maximum <= console.width:
        console.print(table)
        return
    for row in rows:
        for column, cell in zip(table.columns, row):
            console.print(Text(f"  {column.header}: {cell}"), soft_wrap=True)
        console.print()


def table_of(*columns: str, title: str) -> Table:
    table = CellTable(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    for c in columns:
        table.add_column(c, overflow="fold")
    return table


def print_json(rows: list[dict[str, Any]]) -> None:
    console.print_json(json.dumps(rows, default=str))


LAG_LIMIT_S = 15 * 60  # a table is lagging past this where compaction.max_compaction_lag_seconds is unset


def lag_limit(settings: Settings) -> timedelta:
    """How old a table's oldest dirty event may get before `status` counts it as lagging:
    `compaction.max_compaction_lag_seconds`, else 15 minutes."""
    return timedelta(seconds=settings.compaction.max_compaction_lag_seconds or LAG_LIMIT_S)


def print_status(
    settings: Settings,
    as_json: bool = False,
    streams: bool = False,
    globs: list[str] | None = None,
    now: datetime | None = None,
) -> None:
    """One line per table (`status_table`), or per stream with `streams`, of the tables matching
    `globs` (all without), then the summary line; with `as_json`, every stream's figures, with
    its lag in seconds at `now`."""
    from dataclasses import asdict

    from connector.app import status as get_status

    now = now or datetime.now(UTC)
    rows = get_status(settings, now, globs)
    if as_json:
        return print_json(
            [
                asdict(s)
                | {
                    "usage_bytes": s.usage_bytes,
                    "first_dirty_time": s.first_dirty_time.isoformat() if s.first_dirty_time else None,
                    "lag_seconds": lag_seconds(s.first_dirty_time, now),
                }
                for s in rows
            ]
        )
    show_status(rows, now, lag_limit(settings), streams)


def show_status(rows: list[StreamStatus], now: datetime, limit: timedelta, streams: bool = False) -> None:
    """The table of `rows` (per table, or per stream with `streams`), then the summary line."""
    show(status_streams(rows, now) if streams else status_table(rows, now))
    console.print(Text(status_summary(rows, now, limit)), soft_wrap=True)


def by_table(rows: list[StreamStatus]) -> dict[str, list[StreamStatus]]:
    """The rows grouped by table, tables in the order they first come."""
    out: dict[str, list[StreamStatus]] = {}
    for s in rows:
        out.setdefault(s.table, []).append(s)
    return out


def lag_seconds(first_dirty: datetime | None, now: datetime) -> float | None:
    """The age of an oldest dirty event at `now` (None: nothing dirty)."""
    return None if first_dirty is None else max(0.0, (now - first_dirty).total_seconds())


def oldest_dirty(streams: list[StreamStatus]) -> datetime | None:
    return min((s.first_dirty_time for s in streams if s.first_dirty_time is not None), default=None)


def lagging(streams: list[StreamStatus], now: datetime, limit: timedelta) -> bool:
    """Whether a table's oldest dirty event is `limit` old or older (a log-only table never is)."""
    first = oldest_dirty(streams)
    return first is not None and all(s.compaction for s in streams) and now - first >= limit


def age_text(seconds: float | None) -> str:
    """An age in its two largest units: `42s`, `4m 10s`, `2h 5m`, `3d 4h`; `-` for None."""
    if seconds is None:
        return "-"
    n = int(seconds)
    for unit, size, small, small_size in (("d", 86_400, "h", 3_600), ("h", 3_600, "m", 60), ("m", 60, "s", 1)):
        if n >= size:
            return f"{n // size}{unit} {n % size // small_size}{small}"
    return f"{n}s"


def status_table(rows: list[StreamStatus], now: datetime) -> Table:
    """A line per table: its dirty events, and of its partitions the highest dirty ratio, the
    oldest dirty event's age and the fullest one's usage of the quota (rows, tombstones and
    partitions: `status_streams`, `usage_table`)."""
    table = table_of(
        *("table", "dirty", "ratio", "lag", "usage"),
        title="status per table (ratio, lag, usage: its worst partition's)",
    )
    for name, ss in by_table(rows).items():
        full = max(ss, key=lambda s: s.usage_bytes)
        table.add_row(
            name,
            f"{sum(s.dirty_events for s in ss):,}",
            f"{max(s.dirty_ratio for s in ss):.2f}",
            age_text(lag_seconds(oldest_dirty(ss), now)) if all(s.compaction for s in ss) else "log only",
            usage_text(full.usage_bytes, full.quota_bytes),
        )
    return table


def status_streams(rows: list[StreamStatus], now: datetime) -> Table:
    table = table_of(
        *("stream", "from", "cleaned", "dirty", "ratio", "lag", "rows", "tombstones", "usage"),
        title="status per stream (from: the log's first offset; cleaned: the cleaner point)",
    )
    for s in rows:
        table.add_row(
            s.stream,
            "-" if s.log_from is None else f"{s.log_from:,}",
            f"{s.cleaner_point:,}",
            f"{s.dirty_events:,}",
            f"{s.dirty_ratio:.2f}",
            age_text(lag_seconds(s.first_dirty_time, now)) if s.compaction else "log only",
            f"{s.live_rows:,}",
            f"{s.tombstones:,}",
            usage_text(s.usage_bytes, s.quota_bytes),
        )
    return table


def status_summary(rows: list[StreamStatus], now: datetime, limit: timedelta) -> str:
    """`<n> tables, <d> due, <l> lagging`: due, a table the planner would compact now (one of
    its partitions); lagging, one whose oldest dirty event is `limit` old or older."""
    tables = by_table(rows)
    due = sum(any(s.due for s in ss) for ss in tables.values())
    late = sum(lagging(ss, now, limit) for ss in tables.values())
    return f"{len(tables):,} table{'' if len(tables) == 1 else 's'}, {due:,} due, {late:,} lagging"


def share(part: float, whole: float) -> str:
    """`part` of `whole` in percent, as a person reads it: `<0.01%`, `3.9%`, `100%`."""
    pct = 100 * part / whole
    if part == 0:
        return "0%"
    return "<0.01%" if pct < 0.01 else f"{pct:.2g}%" if pct < 10 else f"{math.floor(pct)}%"  # 99.7%: not full


def usage_text(used: int, limit: int | None) -> str:
    """`1.2 KB of 1 GB (<0.01%)`, or the bytes alone where the tier sets no compacted quota."""
    if limit is None:
        return human_bytes(used)
    return f"{human_bytes(used)} of {human_bytes(limit)} ({share(used, limit)})"


def print_quotas(
    settings: Settings, as_json: bool = False, streams: bool = False, globs: list[str] | None = None
) -> None:
    """The tiers, then a line per table of those matching `globs` (all without): its fullest
    partition's usage against its tier; per partition with `streams`."""
    from dataclasses import asdict

    from connector.app import status as get_status
    from quotas.ledger import tiers

    usage = get_status(settings, globs=globs)
    if as_json:
        return print_json(
            [
                {
                    "tiers": [asdict(q) for q in tiers(settings).values()],
                    "usage": [
                        {
                            "table": s.table,
                            "stream": s.stream,
                            "tier": s.tier,
                            "usage_bytes": s.usage_bytes,
                            "quota_bytes": s.quota_bytes,
                        }
                        for s in usage
                    ],
                }
            ]
        )
    table = table_of(
        "tier",
        "compaction",
        "quota",
        "event",
        "partitions",
        "days",
        "groups",
        title="tiers (quota: compacted bytes per partition; event: its largest size; days: longest retention)",
    )
    for q in tiers(settings).values():
        table.add_row(
            q.name,
            "yes" if q.compaction_supported else "no",
            human_bytes(q.compacted_bytes_per_partition) if q.compacted_bytes_per_partition else "-",
            human_bytes(q.max_event_bytes),
            str(q.max_partitions),
            str(q.max_retention_days),
            str(q.consumer_groups),
        )
    show(table)
    show(usage_streams(usage) if streams else usage_table(usage))


def usage_table(rows: list[StreamStatus]) -> Table:
    """A line per table: its tier, partitions and its fullest partition's usage of the quota."""
    table = table_of(
        "table",
        "tier",
        "parts",
        "usage",
        title="usage per table (its fullest partition's: state + tombstones + dirty log)",
    )
    for name, ss in by_table(rows).items():
        full = max(ss, key=lambda s: s.usage_bytes)
        table.add_row(name, full.tier, str(len(ss)), usage_text(full.usage_bytes, full.quota_bytes))
    return table


def usage_streams(rows: list[StreamStatus]) -> Table:
    table = table_of(
        "stream", "table", "tier", "usage", title="usage per partition (state + tombstones + dirty log: key + payload)"
    )
    for s in rows:
        table.add_row(s.stream, s.table, s.tier, usage_text(s.usage_bytes, s.quota_bytes))
    return table


def print_query(settings: Settings, sql: str, limit: int, engine: str = "spark") -> None:
    """The first `limit` rows of `sql` run on Spark, or on DuckDB (`iceberg.duckdb_query`: no JVM)."""
    if engine == "duckdb":
        from iceberg.duckdb_query import run

        result = run(settings, sql)
        columns, rows = result.column_names, [tuple(r.values()) for r in result.slice(0, limit).to_pylist()]
    elif engine == "spark":
        from pyspark.errors import PySparkException

        from iceberg.spark import get_spark

        try:
            df = get_spark(settings).sql(sql)
            columns, rows = df.columns, [tuple(r) for r in df.limit(limit).collect()]
        except PySparkException as e:  # Spark's own message, first line: no JVM stack trace
            raise QueryError(f"query failed: {str(e).strip().splitlines()[0]}") from None
    else:
        raise ConfigError(f"--engine {engine!r}: give spark or duckdb")
    table = table_of(*columns, title=sql)
    for r in rows:
        table.add_row(*["" if v is None else str(v) for v in r])
    show(table)


# A report of more tables than this shows the busiest ones and sums up the rest in a line
# (`cdclake status` has a line for every table)
REPORT_ROWS = 20


def busiest(rows: list[T], size: Callable[[T], int]) -> tuple[list[T], list[T]]:
    """`rows` as they are where they fit the report, else the `REPORT_ROWS` largest by `size`
    (in their order) and the others."""
    if len(rows) <= REPORT_ROWS:
        return rows, []
    top = set(sorted(range(len(rows)), key=lambda i: -size(rows[i]))[:REPORT_ROWS])
    return [r for i, r in enumerate(rows) if i in top], [r for i, r in enumerate(rows) if i not in top]


def print_ingest(stats: Any) -> None:
    """A row per table with records, the busiest `REPORT_ROWS` of them where there are more
    (and a line summing up the others)."""
    table = table_of(
        "table",
        "accepted",
        "dead letters",
        title=f"ingested {stats.records:,} records ({stats.duplicates:,} already held, skipped)",
    )
    counts = [
        (name, stats.accepted.get(name, 0), stats.dead_letters.get(name, 0))
        for name in sorted(set(stats.accepted) | set(stats.dead_letters))
    ]
    shown, rest = busiest(counts, lambda c: c[1] + c[2])
    for name, accepted, letters in shown:
        table.add_row(name, f"{accepted:,}", f"{letters:,}")
    show(table)
    if rest:
        accepted, letters = sum(c[1] for c in rest), sum(c[2] for c in rest)
        console.print(Text(f"and {len(rest):,} more tables: {accepted:,} accepted, {letters:,} dead letters"))


def print_compaction(reports: list[Any]) -> None:
    """One row per table whose round ran (the `REPORT_ROWS` with the most events where more
    ran, and a line summing up the others), then a line for each table's stale events,
    truncates, dead letters, purged tombstones and maintenance, where it has any, and how many
    tables had nothing due."""
    table = table_of("table", "events", "keys", "upserts", "deletes", "stale", "seconds", title="compaction")
    ran = [r for r in reports if r.ran]
    shown, rest = busiest(ran, lambda r: r.events)
    for r in shown:
        table.add_row(
            r.table,
            *[f"{n:,}" for n in (r.events, r.keys, r.upserts, r.deletes, r.stale)],
            f"{r.seconds:.1f}",
        )
    if ran:
        show(table)
    if rest:
        figures = ("events", "keys", "upserts", "deletes", "stale")
        sums = ", ".join(f"{sum(getattr(r, f) for r in rest):,} {f}" for f in figures)
        console.print(Text(f"and {len(rest):,} more tables: {sums}"), soft_wrap=True)
    notes = [f"{r.table}: {note}" for r in ran for note in compaction_notes(r)]
    for line in notes:
        console.print(Text(line), soft_wrap=True)
    if len(ran) < len(reports):
        console.print(f"{len(reports) - len(ran):,} of {len(reports):,} tables: nothing due")


def compaction_notes(r: Any) -> list[str]:
    """What a round did beside its upserts and deletes, a phrase each."""
    return [
        *([f"stale: {', '.join(f'{n:,} {why}' for why, n in sorted(r.stale_reasons.items()))}"] if r.stale else []),
        *([f"truncates: {r.truncates} ({r.truncated:,} keys removed)"] if r.truncates else []),
        *([f"dead letters: {r.refused:,} (schema)"] if r.refused else []),
        *([f"purged: {r.purged:,} expired tombstones"] if r.purged else []),
        *([f"trimmed: {r.trimmed:,} log rows past retention"] if r.trimmed else []),
        *[f"maintenance: {m}" for m in r.maintenance],
    ]

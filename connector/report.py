"""What the CLI prints: tables that never cut a word (a plain `column: value` layout where
they do not fit), JSON for scripts, and the reports of ingest, compaction, status, quotas
and queries. Sizes and shares read as a person says them (`1.2 KB of 1 GB`, `<0.01%`)."""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from connector.core.errors import ConnectorError
from quotas.tiers import human_bytes

if TYPE_CHECKING:
    from connector.core.config import Settings

console = Console()
NUMBER = re.compile(r"-?[\d,]+(\.\d+)?( [KMGT]?B)?|-")


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


def print_status(settings: Settings, as_json: bool = False, streams: bool = False) -> None:
    """One line per table (its fullest partition's usage), or per stream with `streams`."""
    from dataclasses import asdict

    from connector.app import status as get_status

    rows = get_status(settings)
    if as_json:
        return print_json([asdict(s) | {"usage_bytes": s.usage_bytes} for s in rows])
    if streams:
        table = table_of(
            *("stream", "from", "cleaned", "dirty", "ratio", "rows", "tombstones", "usage"),
            title="status per stream (from: the log's first offset; cleaned: the cleaner point)",
        )
        for s in rows:
            table.add_row(
                s.stream,
                "-" if s.log_from is None else f"{s.log_from:,}",
                f"{s.cleaner_point:,}",
                f"{s.dirty_events:,}",
                f"{s.dirty_ratio:.2f}",
                f"{s.live_rows:,}",
                f"{s.tombstones:,}",
                usage_text(s.usage_bytes, s.quota_bytes),
            )
        return show(table)
    table = table_of(
        *("table", "parts", "dirty", "rows", "tombstones", "usage"),
        title="status (parts: partitions; dirty: events to compact; usage: the fullest partition's)",
    )
    by_table: dict[str, list[Any]] = {}
    for s in rows:
        by_table.setdefault(s.table, []).append(s)
    for name, ss in by_table.items():
        full = max(ss, key=lambda s: s.usage_bytes)
        table.add_row(
            name,
            str(len(ss)),
            f"{sum(s.dirty_events for s in ss):,}",
            f"{sum(s.live_rows for s in ss):,}",
            f"{sum(s.tombstones for s in ss):,}",
            usage_text(full.usage_bytes, full.quota_bytes),
        )
    show(table)


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


def print_quotas(settings: Settings, as_json: bool = False) -> None:
    from dataclasses import asdict

    from connector.app import status as get_status
    from quotas.ledger import tiers

    usage = get_status(settings)
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
    table = table_of(
        "stream", "table", "tier", "usage", title="usage per partition (state + tombstones + dirty log: key + payload)"
    )
    for s in usage:
        table.add_row(s.stream, s.table, s.tier, usage_text(s.usage_bytes, s.quota_bytes))
    show(table)


def print_query(settings: Settings, sql: str, limit: int) -> None:
    from pyspark.errors import PySparkException

    from iceberg.spark import get_spark

    try:
        df = get_spark(settings).sql(sql)
        rows = df.limit(limit).collect()
    except PySparkException as e:  # Spark's own message, first line: no JVM stack trace
        raise QueryError(f"query failed: {str(e).strip().splitlines()[0]}") from None
    table = table_of(*df.columns, title=sql)
    for r in rows:
        table.add_row(*["" if v is None else str(v) for v in r])
    show(table)


def print_ingest(stats: Any) -> None:
    table = table_of(
        "table",
        "accepted",
        "dead letters",
        title=f"ingested {stats.records:,} records ({stats.duplicates:,} already held, skipped)",
    )
    for name in sorted(set(stats.accepted) | set(stats.dead_letters)):
        table.add_row(name, f"{stats.accepted.get(name, 0):,}", f"{stats.dead_letters.get(name, 0):,}")
    show(table)


def print_compaction(reports: list[Any]) -> None:
    """One row per table whose round ran, then a line for each table's stale events,
    truncates, dead letters, purged tombstones and maintenance, where it has any, and how many
    tables had nothing due."""
    table = table_of("table", "events", "keys", "upserts", "deletes", "stale", "seconds", title="compaction")
    notes = []
    ran = [r for r in reports if r.ran]
    for r in ran:
        table.add_row(
            r.table,
            *[f"{n:,}" for n in (r.events, r.keys, r.upserts, r.deletes, r.stale)],
            f"{r.seconds:.1f}",
        )
        notes += [f"{r.table}: {note}" for note in compaction_notes(r)]
    if ran:
        show(table)
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

"""What the CLI prints: tables that never cut a word (a plain `column: value` layout where
they do not fit), JSON for scripts, and the reports of ingest, compaction, status, quotas
and queries."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from connector.core.errors import ConnectorError
from quotas.tiers import human_bytes

if TYPE_CHECKING:
    from connector.core.config import Settings

console = Console()


class QueryError(ConnectorError):
    """A query Spark refused (syntax, unknown table or column)."""


class WrappingTable(Table):
    """A table that never cuts a word: a column is at least as wide as its longest word and
    cells wrap between words; where that does not fit the console (a narrow terminal, a log),
    `show` prints each row as `column: value` lines instead."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cells: list[list[str]] = []

    def add_row(self, *cells: Any, **kwargs: Any) -> None:
        super().add_row(*cells, **kwargs)
        self.cells.append([str(c) for c in cells])
        for column, cell in zip(self.columns, cells):
            words = [len(w) for w in str(cell).split()] + [len(w) for w in str(column.header).split()]
            column.min_width = max([column.min_width or 0, *words])


def show(table: Table) -> None:
    if sum(c.min_width or 1 for c in table.columns) + 3 * len(table.columns) + 1 <= console.width:
        console.print(table)
        return
    console.print(Text(str(table.title or "")), style="bold")
    for row in table.cells if isinstance(table, WrappingTable) else []:
        for column, cell in zip(table.columns, row):
            console.print(Text(f"  {column.header}: {cell}"), soft_wrap=True)
        console.print()


def table_of(*columns: str, title: str) -> Table:
    table = WrappingTable(title=title)
    for c in columns:
        table.add_column(c, overflow="fold")
    return table


def print_json(rows: list[dict[str, Any]]) -> None:
    console.print_json(json.dumps(rows, default=str))


def print_status(settings: Settings, as_json: bool = False) -> None:
    from dataclasses import asdict

    from connector.app import status as get_status

    rows = get_status(settings)
    if as_json:
        return print_json([asdict(s) | {"usage_bytes": s.usage_bytes} for s in rows])
    table = table_of(
        "table",
        "stream",
        "log from",
        "cleaner point",
        "dirty events",
        "dirty bytes",
        "clean bytes",
        "dirty ratio",
        "live rows",
        "tombstones",
        "usage / quota",
        title="status",
    )
    for s in rows:
        table.add_row(
            s.table,
            s.stream,
            "-" if s.log_from is None else f"{s.log_from:,}",
            f"{s.cleaner_point:,}",
            f"{s.dirty_events:,}",
            human_bytes(s.dirty_bytes),
            human_bytes(s.clean_bytes),
            f"{s.dirty_ratio:.2f}",
            f"{s.live_rows:,}",
            f"{s.tombstones:,}",
            usage_text(s.usage_bytes, s.quota_bytes, s.tier),
        )
    show(table)


def usage_text(used: int, limit: int | None, tier: str) -> str:
    if limit is None:
        return f"{human_bytes(used)} ({tier}: no compacted quota)"
    return f"{100 * used / limit:.4g}% of {human_bytes(limit)} ({tier})"


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
        "compacted size / partition",
        "max event",
        "max partitions",
        "max retention (days)",
        "consumer groups",
        title="tiers",
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
        "table",
        "stream",
        "tier",
        "usage",
        "quota",
        title="usage per partition (state + tombstones + dirty log, key + payload bytes)",
    )
    for s in usage:
        table.add_row(
            s.table, s.stream, s.tier, human_bytes(s.usage_bytes), usage_text(s.usage_bytes, s.quota_bytes, s.tier)
        )
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
    table = table_of(
        "table",
        "streams",
        "events",
        "keys",
        "upserts",
        "deletes",
        "stale",
        "truncates",
        "dead letters",
        "purged",
        "maintenance",
        "seconds",
        title="compaction",
    )
    for r in reports:
        stale = "\n".join(f"{n:,} {reason}" for reason, n in sorted(r.stale_reasons.items())) or "0"
        truncates = f"{r.truncates} ({r.truncated:,} keys)" if r.truncates else "0"
        table.add_row(
            r.table,
            str(len(r.ranges)),
            f"{r.events:,}",
            f"{r.keys:,}",
            f"{r.upserts:,}",
            f"{r.deletes:,}",
            stale,
            truncates,
            f"{r.refused:,}",
            f"{r.purged:,}",
            "\n".join(r.maintenance) or "-",
            f"{r.seconds:.1f}",
        )
    show(table)

"""The operating commands (`cdclake status`, `quotas`, `query`, `read`, `history`, `verify`,
`rebuild`): their declarations, which the CLI registers, and what they print."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from connector.commands import ConfigOpt, GlobOpt, JsonOpt, StreamsOpt, WaitOpt, guard, settings_of
from connector.core.config import Settings
from connector.core.errors import ConfigError
from connector.report import console, print_query, print_quotas, print_status, show, table_of

if TYPE_CHECKING:
    from iceberg.verify import VerifyReport


def print_read(
    settings: Settings,
    table: str,
    partition: int | None,
    from_offset: int | None,
    as_of: int | None,
    fmt: str,
    limit: int | None,
) -> None:
    if fmt not in ("jsonl", "table"):
        raise ConfigError(f"--format {fmt!r}: give jsonl or table")
    from connector.app import table_names
    from iceberg.catalog import load_catalog
    from iceberg.reader import as_json, compacted_log, rows
    from iceberg.spark import get_spark

    catalog = load_catalog(settings)
    (names,) = table_names(settings, catalog, [table])
    frame = compacted_log(get_spark(settings), catalog, names, partition, from_offset, as_of)
    if limit is not None:
        frame = frame.limit(limit)
    if fmt == "jsonl":
        for row in rows(frame):
            print(json.dumps(as_json(row), ensure_ascii=False))
        return
    out = table_of("partition", "offset", "sequence", "enqueued", "key", "value", title=f"compacted log of {table}")
    for row in rows(frame):
        j = as_json(row)
        out.add_row(str(j["partition"]), j["offset"], str(j["sequence_number"]), j["enqueued_time"], str(j["key"]),
                    "(tombstone)" if row["tombstone"] else str(j.get("value", j.get("value_base64"))))  # fmt: skip
    show(out)


def print_history(settings: Settings, table: str, key: str | None, write: bool, limit: int) -> None:
    from connector.app import table_names
    from iceberg.catalog import load_catalog
    from iceberg.history import history, write_history
    from iceberg.spark import get_spark

    (names,) = table_names(settings, load_catalog(settings), [table])
    spark, ordering = get_spark(settings), settings.compaction.ordering
    if write:
        console.print(f"wrote {write_history(spark, names, ordering)}")
        return
    rows = history(spark, names, ordering, key).limit(limit).collect()
    out = table_of("key", "version", "op", "valid from", "valid to", "offset", "after", title=f"history of {table}")
    for r in rows:
        out.add_row(r["_key"], str(r["version"]), r["_op"], str(r["valid_from"]), str(r["valid_to"] or "-"),
                    f"{r['_partition_id']}:{r['_offset']}", r["after"] or "-")  # fmt: skip
    show(out)


def verify_or_rebuild(settings: Settings, table: str, rebuild: bool = False, wait: float = 0.0) -> VerifyReport:
    from connector.app import policy_of, table_names
    from iceberg import verify as v
    from iceberg.catalog import load_catalog
    from iceberg.spark import get_spark

    catalog = load_catalog(settings)
    (names,) = table_names(settings, catalog, [table])
    spark, policy, now = get_spark(settings), policy_of(settings), datetime.now(UTC)
    with console.status(f"recomputing {names.state} from its log"):
        report = (
            v.rebuild(spark, catalog, names, policy, now, wait)
            if rebuild
            else v.verify(spark, catalog, names, policy, now)
        )
    ranges = ", ".join(f"{s} {lo}..{hi}" for s, (lo, hi) in sorted(report.horizon.items()))
    done = "rebuilt" if rebuild else "recomputed"
    console.print(f"{names.state}: {done} from the log's {report.events:,} events ({ranges or 'none'})")
    if rebuild:
        return report
    out = table_of("table", *v.KINDS, title="differences" if not report.ok else "no differences")
    for kind, counts in report.counts.items():
        samples = report.samples.get(kind, {})
        cells = [f"{counts[k]:,}" + ("".join(f"\n{key}" for key in samples.get(k, []))) for k in v.KINDS]
        out.add_row(kind, *cells)
    show(out)
    return report


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
    settings = settings_of(config)
    guard(lambda: print_status(settings, as_json, streams, table))


def quotas(
    config: Path | None = ConfigOpt,
    as_json: bool = JsonOpt,
    streams: bool = StreamsOpt,
    table: list[str] | None = GlobOpt,
) -> None:
    """The Event Hubs tiers (and custom ones), then a line per table: its tier, partitions and its
    fullest partition's usage against the tier; per partition with --streams.

    Examples: `cdclake quotas -c lake.toml`, `cdclake quotas -c lake.toml --streams -t 'inventory_*'`"""
    settings = settings_of(config)
    guard(lambda: print_quotas(settings, as_json, streams, table))


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
    settings = settings_of(config)
    guard(lambda: print_query(settings, sql, limit, engine))


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
    settings = settings_of(config)
    guard(lambda: print_read(settings, table, partition, from_offset, as_of, fmt, limit))


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
    settings = settings_of(config)
    guard(lambda: print_history(settings, table, key, write, limit))


def verify(
    table: str = typer.Argument(..., help="source table, e.g. customers"),
    config: Path | None = ConfigOpt,
) -> None:
    """Recompute the table's state and tombstones from its log (a full compaction into scratch
    tables, dropped afterwards) and compare them with the tables, key by key: `missing`,
    `extra`, `different offset`, `different row`. Exit code 1 on any difference.

    Example: `cdclake verify orders -c lake.toml`"""
    settings = settings_of(config)
    report = guard(lambda: verify_or_rebuild(settings, table))
    if not report.ok:
        raise typer.Exit(1)


def rebuild(
    table: str = typer.Argument(..., help="source table, e.g. customers"),
    config: Path | None = ConfigOpt,
    wait: float = WaitOpt,
) -> None:
    """Recompute the table's state and tombstones from its log and put them in place of the
    tables' (after a corruption, or for a changed ordering rule), with the cleaner points.
    Each table is replaced in one snapshot; the table's compaction waits meanwhile.

    Example: `cdclake rebuild orders -c lake.toml`, then `cdclake verify orders -c lake.toml`"""
    settings = settings_of(config)
    guard(lambda: verify_or_rebuild(settings, table, rebuild=True, wait=wait))

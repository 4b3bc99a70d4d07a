"""What the operating commands print (`cdclake read`, `history`, `verify`, `rebuild`): the
CLI declares them, this module runs them and shows their results."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from connector.core.config import Settings
from connector.core.errors import ConfigError
from connector.report import console, show, table_of

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

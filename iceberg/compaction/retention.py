"""Log retention: the log's rows older than the retention that no key needs go.

Kept whatever their age: everything at or past the stream's cleaner point (never a dirty
event), each live key's and each tombstone's winning event (the reader's value bytes, the
recomputation of `verify` and `rebuild`) with the event whose source position it took (a
bare tombstone's delete), and every truncate (it removes older keys on recomputation).
The rest older than the cut-off is removed by a row delete, once the files whose
`enqueued_time` bounds say they may hold old rows hold more than twice the rows of the
state and tombstones (the most the keys keep): a steady stream trims in batches, not each
round. The log's commits rule the trim out first where they can (`may_be_older`).
Dead letters older than the cut-off go too. The log's trimming commit records the cut-off
(`summary_keys.TRIMMED_BEFORE`).
"""

from __future__ import annotations

from datetime import datetime
from functools import reduce

from pyiceberg.catalog import Catalog
from pyiceberg.expressions import BooleanExpression, LessThan
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from iceberg.catalog import forget
from iceberg.compaction import writes
from iceberg.compaction.report import micros
from iceberg.compaction.stats import cleaner_points, load_optional
from iceberg.layouts import TableNames
from iceberg.summary_keys import APPENDED, TRIMMED_BEFORE


def _rows(catalog: Catalog, name: str) -> int:
    """The table's live rows, from its snapshot summary: the rows of its data files less those
    position-deleted (a small table keeps its deleted rows until a rewrite); 0 without a
    table or a snapshot."""
    table = load_optional(catalog, name)
    snapshot = table.current_snapshot() if table is not None else None
    if snapshot is None or snapshot.summary is None:
        return 0
    props = snapshot.summary.additional_properties
    return int(props.get("total-records", 0)) - int(props.get("total-position-deletes", 0))


# Summary fields of a commit that removed rows or files
REMOVING = ("deleted-data-files", "deleted-records", "added-delete-files", "added-position-deletes", "removed-dvs")


def _older(cutoff: datetime) -> BooleanExpression:
    return LessThan("enqueued_time", cutoff.isoformat())  # type: ignore[call-arg,misc]


def log_due(catalog: Catalog, names: TableNames, points: dict[str, int], cutoff: datetime) -> bool:
    """The trigger of the log's trim: the log's rows that may be older than `cutoff` are more
    than the keys may keep: two a live row or tombstone of the state and tombstones (its
    winning event, and the one whose position it took), so a trim leaves the trigger unmet.
    Told first by the log's commits (`may_be_older`), then, where they do not rule it out, by
    the rows of the files whose bounds in the manifests say they may hold such a row."""
    if not points:
        return False
    log_table = catalog.load_table(names.log)
    most = may_be_older(log_table, cutoff)
    if most == 0:
        return False
    keep = 2 * sum(_rows(catalog, t) for t in (names.state, names.tombstones))
    if most is not None and most <= keep:
        return False
    return sum(t.file.record_count for t in log_table.scan(row_filter=_older(cutoff)).plan_files()) > keep


def may_be_older(table: Table, cutoff: datetime) -> int | None:
    """At most how many of a log's or dead letters' rows are older than `cutoff`, from their
    commits' summaries alone: the table's rows less those its newest appends added where every
    row they added is not older (`APPENDED`'s oldest enqueued time). The walk back ends at a
    commit that removed rows or files (a trim, a rewrite: the files before it may have
    changed), at one that does not record what it appended, and where the history does. None
    where the summary does not count the rows."""
    snapshot = table.current_snapshot()
    total = snapshot.summary.additional_properties.get("total-records") if snapshot and snapshot.summary else None
    if total is None:
        return None if snapshot is not None else 0
    young, us = 0, micros(cutoff)
    by_id = {s.snapshot_id: s for s in table.snapshots()}  # pyiceberg's `snapshot_by_id` searches a list
    while snapshot is not None and snapshot.summary is not None:
        props = snapshot.summary.additional_properties
        if any(int(props.get(k, 0)) for k in REMOVING):
            break
        added = int(props.get("added-records", 0))
        if added:
            record = APPENDED.of(snapshot)
            if snapshot.summary.operation != Operation.APPEND or not record or min(r[4] for r in record.values()) < us:
                break
            young += added
        snapshot = by_id.get(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id is not None else None
    return int(total) - young


def dead_letters_due(catalog: Catalog, names: TableNames, cutoff: datetime) -> bool:
    """Whether a dead-letter file may hold a row older than `cutoff`: not where the table's
    commits say none may (`may_be_older`), else by the files' bounds in the manifests."""
    if not catalog.table_exists(names.dead_letters):
        return False
    table = catalog.load_table(names.dead_letters)
    return may_be_older(table, cutoff) != 0 and any(True for _ in table.scan(row_filter=_older(cutoff)).plan_files())


def due(catalog: Catalog, names: TableNames, cutoff: datetime) -> bool:
    """Whether `trim` at `cutoff` would do anything (metadata only)."""
    points = cleaner_points(load_optional(catalog, names.state))
    return log_due(catalog, names, points, cutoff) or dead_letters_due(catalog, names, cutoff)


def trim(spark: SparkSession, catalog: Catalog, names: TableNames, cutoff: datetime) -> int:
    """Applies the module's rule at `cutoff`; returns how many log rows went."""
    points = cleaner_points(load_optional(catalog, names.state))
    trimmed = 0
    if log_due(catalog, names, points, cutoff):
        keys = ["topic", "partition", "sequence_number"]
        stream = F.concat_ws(":", "topic", F.col("partition").cast("string"))
        point = F.create_map(*[x for s, p in sorted(points.items()) for x in (F.lit(s), F.lit(p))])
        held = reduce(
            DataFrame.unionByName,
            [
                spark.table(names.spark(t)).select(
                    F.col("_topic").alias("topic"),
                    F.col("_partition_id").alias("partition"),
                    F.col("_sequence_number").alias("sequence_number"),
                    F.col("_key").alias("key"),
                    F.col("_source_position").alias("source_position"),
                )
                for t in (names.state, names.tombstones)
            ],
        )
        # a held row's position may be another event's: a bare tombstone takes its delete's
        # (`connector.core.ordering`), and that event stays for the recomputation to give it again
        givers = held.where(F.col("source_position").isNotNull()).select("key", "source_position")
        gone = (
            spark.table(names.spark(names.log))
            .where((F.col("enqueued_time") < F.lit(cutoff)) & (F.col("op") != "t"))
            .where(F.col("sequence_number") < F.coalesce(point[stream], F.lit(0)))
            .select(*keys, "key", "source_position")
            .join(held.select(*keys), keys, "left_anti")
            .join(givers, ["key", "source_position"], "left_anti")
            .select(*keys)
            .localCheckpoint(eager=True)
        )
        trimmed = gone.count()
        if trimmed:
            gone.createOrReplaceTempView("cdclake_trim")
            writes.merge(
                spark,
                f"MERGE INTO {names.spark(names.log)} t USING cdclake_trim s ON t.topic = s.topic "
                "AND t.partition = s.partition AND t.sequence_number = s.sequence_number WHEN MATCHED THEN DELETE",
                TRIMMED_BEFORE.entry(cutoff),
            )
            forget(catalog, names.log)
    if dead_letters_due(catalog, names, cutoff):
        spark.sql(
            f"DELETE FROM {names.spark(names.dead_letters)} WHERE enqueued_time < TIMESTAMP "
            f"'{cutoff.strftime('%Y-%m-%d %H:%M:%S.%f')}'"
        )
        forget(catalog, names.dead_letters)
    return trimmed

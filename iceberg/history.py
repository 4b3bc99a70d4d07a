"""History (SCD type 2) from the log: one row per version of each key, within the log's
retention.

A version is an event the ordering rule applied: the log's events per key in the rule's
order (the order of `dedupe.rank`, a bare tombstone carrying its delete's position), less
the stale ones (older than one that arrived before them: compaction ignored them too) and
less a bare tombstone that follows its delete (the delete is the deleting event). Each
version holds its event's position, op and after-image, `valid_from` (the source's commit
time, else the enqueued time) and `valid_to` (the next version's `valid_from`; null for the
current one). A deleted key's last version is its deleting event. Truncates are not versions.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from connector.core.ordering import Ordering
from iceberg.compaction import dedupe, winners
from iceberg.layouts import TableNames

HISTORY_SUFFIX = "__history"
COLUMNS = [
    "_key", "version", "_op", "after", "valid_from", "valid_to", "is_current",
    "_topic", "_partition_id", "_offset", "_sequence_number", "_enqueued_time", "_source_position",
]  # fmt: skip


def history(spark: SparkSession, names: TableNames, ordering: Ordering, key: str | None = None) -> DataFrame:
    log = spark.table(names.spark(names.log)).where(F.col("key").isNotNull())
    if key is not None:
        log = log.where(F.col("key") == key)
    ranked = dedupe.rank(winners.log_candidates(log), ordering).where(F.col("_stale").isNull())
    by_key = Window.partitionBy("_key").orderBy("_o")
    versions = ranked.withColumn("_prev_op", F.coalesce(F.lag("_op").over(by_key), F.lit(""))).where(
        ~((F.col("_op") == "d") & (F.col("_prev_op") == "d"))
    )
    after = log.select(
        F.col("topic").alias("_topic"),
        F.col("partition").alias("_partition_id"),
        F.col("sequence_number").alias("_sequence_number"),
        "after",
    )
    since = F.coalesce(F.timestamp_millis(F.col("_source_ts")), F.col("_enqueued_time"))
    return (
        versions.join(after, ["_topic", "_partition_id", "_sequence_number"])
        .withColumn("valid_from", since)
        .withColumn("version", F.row_number().over(by_key))
        .withColumn("valid_to", F.lead("valid_from").over(by_key))
        .withColumn("is_current", F.lead("_o").over(by_key).isNull())
        .select(*COLUMNS)
        .orderBy("_key", "version")
    )


def write_history(spark: SparkSession, names: TableNames, ordering: Ordering) -> str:
    """Materializes the history as the table `<ns>.<t>__history` (replaced in one snapshot)."""
    name = names.state + HISTORY_SUFFIX
    history(spark, names, ordering).writeTo(names.spark(name)).using("iceberg").createOrReplace()
    return name

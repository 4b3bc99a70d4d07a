"""The dedupe transform (DataFrame -> DataFrame): the newest change per key.

Implements `connector.ordering` over Spark columns. Candidates are the dirty log events of
the round plus the rows already held for the same keys (state or tombstone, `_held`).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from connector.ordering import Ordering

POSITION_TYPE = "array<bigint>"

# Columns every candidate carries (held rows have `_after` null).
CANDIDATE_COLUMNS = [
    "_key", "_topic", "_partition_id", "_offset", "_sequence_number", "_enqueued_time", "_op",
    "_snapshot", "_source_ts", "_source_position", "_payload_bytes", "_after", "_after_types", "_held",
]


def order_struct(position: Column, snapshot: Column, partition: Column, seq: Column, ordering: Ordering) -> Column:
    """The Spark twin of `connector.ordering.order_key`."""
    empty = F.array().cast(POSITION_TYPE)
    if ordering == "log":
        return F.struct(empty.alias("p"), F.lit(1).alias("r"), partition.alias("part"), seq.alias("seq"))
    return F.struct(
        F.coalesce(position, empty).alias("p"),
        F.when(snapshot, F.lit(0)).otherwise(F.lit(1)).alias("r"),
        partition.alias("part"),
        seq.alias("seq"),
    )


def literal_order(position: list[int] | None, snapshot: bool, partition: int, seq: int, ordering: Ordering) -> Column:
    pos = F.array(*[F.lit(int(x)) for x in position]).cast(POSITION_TYPE) if position else F.lit(None).cast(POSITION_TYPE)
    return order_struct(pos, F.lit(bool(snapshot)), F.lit(int(partition)), F.lit(int(seq)), ordering)


def rank(candidates: DataFrame, ordering: Ordering) -> DataFrame:
    """Adds `_o` (the order struct) and `_stale` (older than the key's held row).

    A candidate without a source position takes the highest position of the candidates
    before it in log order (held row first), so a bare tombstone resolves with its delete.
    """
    by_key = Window.partitionBy("_key")
    in_log_order = by_key.orderBy(F.col("_held").desc(), "_partition_id", "_sequence_number").rowsBetween(
        Window.unboundedPreceding, Window.currentRow
    )
    if ordering == "source":
        # kept as the row's position, so a held bare tombstone still guards its key
        position = F.col("_source_position")
        candidates = candidates.withColumn("_source_position", F.coalesce(position, F.max(position).over(in_log_order)))
    ranked = candidates.withColumn("_o", order_struct(
        F.col("_source_position"), F.col("_snapshot"), F.col("_partition_id"), F.col("_sequence_number"), ordering)
    ).withColumn("_held_o", F.max(F.when(F.col("_held"), F.col("_o"))).over(by_key))
    stale = (~F.col("_held")) & F.col("_held_o").isNotNull() & (F.col("_o") < F.col("_held_o"))
    return ranked.withColumn("_stale", stale)


def latest_per_key(ranked: DataFrame) -> DataFrame:
    """One row per `_key`: the newest candidate, with `_stale` = how many events lost to the held row."""
    winner = F.max_by(F.struct(*[F.col(c) for c in CANDIDATE_COLUMNS], F.col("_o")), F.col("_o"))
    return (
        ranked.groupBy("_key")
        .agg(winner.alias("w"), F.sum(F.col("_stale").cast("int")).alias("_stale"))
        .select("w.*", "_stale")
    )


def resolve(winners: DataFrame, truncate: dict[str, Any] | None, ordering: Ordering) -> DataFrame:
    """The changes to apply: `_action` 'upsert' (state row) or 'delete' (tombstone).

    A held winner changes nothing, unless a truncate newer than it removes the key: then
    it becomes a delete carrying the truncate's position.
    """
    is_delete = F.col("_op") == "d"
    if truncate is None:
        return winners.where(~F.col("_held")).withColumn(
            "_action", F.when(is_delete, F.lit("delete")).otherwise(F.lit("upsert"))
        )
    t_order = literal_order(truncate["source_position"], truncate["snapshot"], truncate["partition"],
                            truncate["sequence_number"], ordering)
    truncated = F.col("_o") < t_order
    changed = winners.where((~F.col("_held")) | (truncated & ~is_delete))
    replaced = {
        "_topic": F.lit(truncate["topic"]), "_partition_id": F.lit(truncate["partition"]),
        "_offset": F.lit(truncate["offset"]), "_sequence_number": F.lit(truncate["sequence_number"]).cast("bigint"),
        "_enqueued_time": F.lit(truncate["enqueued_time"]), "_op": F.lit("d"), "_snapshot": F.lit(False),
        "_source_ts": F.lit(truncate["source_ts_ms"]).cast("bigint"),
        "_source_position": F.lit(None).cast(POSITION_TYPE) if not truncate["source_position"]
        else F.array(*[F.lit(int(x)) for x in truncate["source_position"]]).cast(POSITION_TYPE),
        "_after": F.lit(None).cast("string"),
    }
    for col, value in replaced.items():
        changed = changed.withColumn(col, F.when(truncated, value).otherwise(F.col(col)))
    return changed.withColumn(
        "_action", F.when(truncated | is_delete, F.lit("delete")).otherwise(F.lit("upsert"))
    )

"""What a round writes: MERGE / INSERT statements, snapshot properties on a Spark commit, the
state's typed columns from the winners' after-images and the tombstones' rows, the bytes per
stream the changes add and the keys whose rows they replace, the stale events' rows, and the
winners the state cannot hold sent to the dead letters."""

from __future__ import annotations

import logging
from datetime import datetime
from functools import reduce
from typing import Any

from pyiceberg.catalog import Catalog
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from iceberg import compat_spark
from iceberg.columns import once_per_context
from iceberg.compaction import schema
from iceberg.compaction.dedupe import HELD_COLUMNS, position_text
from iceberg.compaction.schema import ColumnPlan
from iceberg.layouts import DEAD_LETTER_SCHEMA, META_COLUMNS, POSITION_TEXT, STALE_COLUMNS, TableNames
from iceberg.log_writer import upgrade
from iceberg.maintenance import sql_literal
from quotas.metrics import DEAD_LETTERS

log = logging.getLogger(__name__)
SNAPSHOT_PROPERTY = "spark.sql.iceberg.snapshot-property."
HEADERS_DDL = "array<struct<key: string, value: binary>>"  # `layouts.HEADERS_TYPE` in Spark's words


def merge(spark: SparkSession, sql: str, properties: dict[str, str]) -> None:
    for k, v in properties.items():
        spark.conf.set(SNAPSHOT_PROPERTY + k, v)
    try:
        spark.sql(sql)
    finally:
        for k in properties:
            spark.conf.unset(SNAPSHOT_PROPERTY + k)


def record(spark: SparkSession, table: str, properties: dict[str, str]) -> None:
    """A commit of `properties` alone to `table` (its Spark name): Spark's append of no rows,
    which Iceberg commits as a snapshot that adds no file (pyiceberg cannot commit to a
    format-3 table)."""
    merge(spark, f"INSERT INTO {table} SELECT * FROM {table} WHERE false", properties)


def write(spark: SparkSession, catalog: Catalog, name: str, sql: str, properties: dict[str, str]) -> None:
    """Runs `sql`, a write to table `name`, with `properties` in its snapshot's summary. Where
    the current snapshot after it does not record them (Spark made none, nothing changed, or
    one without them: a DELETE of whole files, which Iceberg commits without the session's
    snapshot properties), an empty commit records them."""
    merge(spark, sql, properties)
    after = catalog.load_table(name).current_snapshot()
    summary = after.summary.additional_properties if after and after.summary else {}
    if properties and not properties.items() <= summary.items():
        record(spark, ".".join(f"`{p}`" for p in (catalog.name, *name.split("."))), properties)  # as TableNames.spark


def commit_delta(
    table: str,
    changes: DataFrame,
    keep: str,
    held: str,
    properties: dict[str, str],
    base: int | None,
    columns: ColumnPlan | None = None,
) -> None:
    """Commits to `table` (its Spark name), in one snapshot with `properties`, the `changes`
    whose `_action` is `keep` (by name; a column they lack is null) and the removal of the row
    each changed key held, which their struct column `held` locates (`_at._file`, `_at._pos`,
    read at snapshot `base` or later; None: the table had none), through Iceberg's API
    (infra/delta-writer/DeltaWriter.java): the same snapshot a MERGE of them writes, without
    its plan, scan and join, and with the `columns` plan's new and widened columns (no schema
    change of its own). It fails if another writer changed the table since `base`."""
    add, widen = (columns.add, columns.widen) if columns is not None else ({}, {})
    compat_spark.delta_commit(changes, table, keep, held, properties, -1 if base is None else base, add, widen)


def state_source(changes: DataFrame, columns: dict[str, str]) -> DataFrame:
    """The changes as rows of the state: its meta columns, its data `columns` (name: type)
    from the after-image, the action and the rows their keys held."""
    return compat_spark.select(changes, _state_columns(tuple(columns.items()), _held(changes)))


@once_per_context
def _state_columns(columns: tuple[tuple[str, str], ...], held: tuple[str, ...]) -> Any:
    after = F.from_json(F.col("_after"), "map<string,string>")
    data = []
    for col, t in columns:
        raw = after.getItem(col)
        data.append((F.unbase64(raw) if t == "binary" else raw.cast(t)).alias(col))
    return compat_spark.column_seq([*_meta(), *data, *map(F.col, ("_action", *held))])


def _meta() -> list[Column]:
    """The meta columns of a state or tombstone row from a change's."""
    text = position_text(F.col("_source_position")).alias(POSITION_TEXT)
    return [text if n == POSITION_TEXT else F.col(n) for n, _ in META_COLUMNS]


def _held(changes: DataFrame) -> tuple[str, ...]:
    """The changes' columns that locate the rows their keys held (`dedupe.latest_per_key`)."""
    return tuple(c for c, _ in HELD_COLUMNS if c in changes.columns)


def tombstone_source(changes: DataFrame, now: datetime, retention: int) -> DataFrame:
    """The changes as rows of the tombstones: a delete's own, deleted `now` and expiring
    `retention` seconds later; any other change's without them (its key's tombstone goes)."""
    return compat_spark.select(changes, _tombstone_columns(now, retention, _held(changes)))


@once_per_context
def _tombstone_columns(now: datetime, retention: int, held: tuple[str, ...]) -> Any:
    deleted, ts = F.col("_action") == "delete", F.lit(now)
    return compat_spark.column_seq(
        [
            *_meta(),
            F.when(deleted, ts).alias("deleted_at"),
            F.when(deleted, ts + F.expr(f"INTERVAL {retention} SECONDS")).alias("expires_at"),
            *map(F.col, ("_action", *held)),
        ]
    )


def bytes_delta(
    changes: DataFrame, held_rows: DataFrame | None, broadcast: bool, by: tuple[str, ...] = (), carried: bool = False
) -> dict[tuple[object, ...], dict[str, dict[str, int]]]:
    """Per value of the columns `by` (`()` without them), table ('s' the state, 't' the
    tombstones) and stream, the bytes the changes add (`bytes_rows`, collected)."""
    return bytes_by(bytes_rows(changes, held_rows, broadcast, by, carried).collect(), by)


def bytes_by(rows: list[Any], by: tuple[str, ...]) -> dict[tuple[object, ...], dict[str, dict[str, int]]]:
    """`bytes_rows`'s rows (grouped by the columns `by`) by group, table and stream."""
    out: dict[tuple[object, ...], dict[str, dict[str, int]]] = {}
    for row in rows:
        stream = f"{row['_topic']}:{row['_partition_id']}"
        out.setdefault(tuple(row[c] for c in by), {}).setdefault(row["_t"], {})[stream] = row["_bytes"] or 0
    return out


def bytes_rows(
    changes: DataFrame, held_rows: DataFrame | None, broadcast: bool, by: tuple[str, ...] = (), carried: bool = False
) -> DataFrame:
    """Per value of the columns `by`, table (`_t`: 's' the state, 't' the tombstones) and
    stream (`_topic`, `_partition_id`), the bytes the changes add (`_bytes`): an upsert's (a
    delete's) row to the state (tombstones), less the row each changed key held: found in
    `held_rows` (the changed keys go to every task of its semi-join where `broadcast`), or
    `carried` by the changes (`dedupe.latest_per_key` with `held`)."""
    frames = [
        changes.where(F.col("_action").isin("upsert", "delete")).select(
            *by,
            F.when(F.col("_action") == "delete", "t").otherwise("s").alias("_t"),
            "_topic",
            "_partition_id",
            F.col("_payload_bytes").alias("_b"),
        )
    ]
    if carried:
        was = [
            F.when(F.col(c).isNotNull(), F.struct(F.lit("t" if tomb else "s").alias("_t"), f"{c}.*"))
            for c, tomb in HELD_COLUMNS
        ]
        held = changes.select(*by, F.explode(F.array(*was)).alias("h")).where(F.col("h").isNotNull()).select(*by, "h.*")
        frames.append(held.select(*by, "_t", "_topic", "_partition_id", (-F.col("_payload_bytes")).alias("_b")))
    elif held_rows is not None:
        keys = changes.select("_key")
        frames.append(
            held_rows.join(F.broadcast(keys) if broadcast else keys, "_key", "left_semi").select(
                *by,
                F.when(F.col("_op") == "d", "t").otherwise("s").alias("_t"),
                "_topic",
                "_partition_id",
                (-F.col("_payload_bytes")).alias("_b"),
            )
        )
    grouped = reduce(DataFrame.unionByName, frames).groupBy(*by, "_t", "_topic", "_partition_id")
    return grouped.agg(F.sum("_b").alias("_bytes"))


def held_keys(column: str) -> Column:
    """The keys of the changes whose `column` (of `dedupe.HELD_COLUMNS`) holds a row."""
    return F.collect_list(F.when(F.col(column).isNotNull(), F.col("_key")))


def stale_rows(found: list[DataFrame], now: datetime) -> DataFrame:
    """The rows of `<t>__stale` for the candidates of `found` with a `_stale` reason."""
    return reduce(
        DataFrame.unionByName,
        [
            f.where(F.col("_stale").isNotNull()).select(
                *[c for c, _ in STALE_COLUMNS if c not in ("reason", "compacted_at")],
                F.col("_stale").alias("reason"),
                F.lit(now).alias("compacted_at"),
            )
            for f in found
        ],
    )


def insert_missing(spark: SparkSession, target: str, source: str, on: list[str]) -> None:
    """Inserts the rows of view `source` that `target` lacks, matched by the columns `on`
    (idempotent: a replayed round adds none twice)."""
    match = " AND ".join(f"t.{schema.quote(c)} = s.{schema.quote(c)}" for c in on)
    spark.sql(f"MERGE INTO {target} t USING {source} s ON {match} WHEN NOT MATCHED THEN INSERT *")


def refuse(
    spark: SparkSession,
    catalog: Catalog,
    names: TableNames,
    changes: DataFrame,
    dirty: DataFrame,
    refused: dict[str, str],
    now: datetime,
) -> tuple[DataFrame, int]:
    """Sends the winners whose after-image the state table cannot hold to the dead letters
    (reason `schema`, the raw record from the log) and returns the changes without them
    (their keys keep what they held) and how many. Idempotent: a replayed round adds none twice."""
    why = F.create_map(*[x for sig, reason in sorted(refused.items()) for x in (F.lit(sig), F.lit(reason))])
    is_refused = (F.col("_action") == "upsert") & F.col("_after_types").isin(list(refused))
    rows = changes.where(is_refused).select(
        F.col("_topic").alias("topic"),
        F.col("_partition_id").alias("partition"),
        F.col("_sequence_number").alias("sequence_number"),
        why[F.col("_after_types")].alias("detail"),
    )
    letters = (
        dirty.select(
            "topic",
            "partition",
            "offset",
            "sequence_number",
            "enqueued_time",
            F.col("key").cast("binary").alias("key"),
            "value",
            F.col("headers") if "headers" in dirty.columns else F.lit(None).cast(HEADERS_DDL).alias("headers"),
        )
        .join(rows, ["topic", "partition", "sequence_number"])
        .select(
            "topic",
            "partition",
            "offset",
            "sequence_number",
            "enqueued_time",
            "key",
            "value",
            "headers",
            F.lit("schema").alias("reason"),
            "detail",
            F.lit(now).alias("ingested_at"),
        )
        .localCheckpoint(eager=True)
    )
    n = letters.count()
    if not catalog.table_exists(names.dead_letters):
        catalog.create_table(names.dead_letters, schema=DEAD_LETTER_SCHEMA)
    upgrade(catalog.load_table(names.dead_letters), DEAD_LETTER_SCHEMA)
    letters.createOrReplaceTempView("cdclake_refused")
    on = ["topic", "partition", "sequence_number", "reason"]
    insert_missing(spark, names.spark(names.dead_letters), "cdclake_refused", on)
    for r in letters.limit(10).collect():
        log.warning(
            "%s: dead letter at compaction: key %s topic %s partition %s offset %s: %s",
            names.state,
            r["key"],
            r["topic"],
            r["partition"],
            r["offset"],
            r["detail"],
        )
    DEAD_LETTERS.labels(names.table, "schema").inc(n)
    return changes.where(~is_refused), n


def write_sql(target: str, source: str, columns: list[str], keep: str, held: list[str] | None) -> str:
    """MERGE the changes into `target`: the key's row is written where `_action` is `keep`,
    removed for any other action. `held`: the keys among the changes' that `target` holds,
    named in the join so that only their rows meet the changes (the rest of the table is
    filtered out as it is read, not shuffled); none held, INSERT the rows it keeps (the same
    result without a join); None, join the whole table."""
    q = schema.quote
    if held == []:
        cols = ", ".join(map(q, columns))
        return f"INSERT INTO {target} ({cols}) SELECT {cols} FROM {source} WHERE _action = '{keep}'"
    sets = ", ".join(f"t.{q(c)} = s.{q(c)}" for c in columns)
    named = f" AND t._key IN ({', '.join(map(sql_literal, held))})" if held else ""
    return (
        f"MERGE INTO {target} t USING {source} s ON t._key = s._key{named} "
        f"WHEN MATCHED AND s._action <> '{keep}' THEN DELETE "
        f"WHEN MATCHED AND s._action = '{keep}' THEN UPDATE SET {sets} "
        f"WHEN NOT MATCHED AND s._action = '{keep}' THEN INSERT ({', '.join(map(q, columns))}) "
        f"VALUES ({', '.join('s.' + q(c) for c in columns)})"
    )

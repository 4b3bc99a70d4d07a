"""The compacted log, as a consumer of the compacted event hub reads it from an offset.

For each live key its latest event (the state's row), each live tombstone (value null), and
the events past the cleaner point that compaction has not reached yet (the hub's
uncompacted head), ordered by partition and offset, with the position, the enqueued time,
the key and the ORIGINAL value bytes from the log. As of a state snapshot too: the state at
that snapshot, the tombstones and the log as they were when it was committed.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connector.core.errors import ConnectorError
from iceberg.layouts import TableNames
from iceberg.summary_keys import CLEANER_POINTS

COLUMNS = ["topic", "partition", "offset", "sequence_number", "enqueued_time", "key", "value", "tombstone"]


@dataclass(frozen=True)
class Horizon:
    """The state snapshot read and what it says: cleaner points, commit time."""

    snapshot_id: int
    committed_at: datetime
    cleaner_points: dict[str, int]


def horizon(catalog: Catalog, names: TableNames, as_of: int | None = None) -> Horizon | None:
    """The state snapshot `as_of` (default: the current one); None before a first compaction."""
    state = catalog.load_table(names.state) if catalog.table_exists(names.state) else None
    snapshot = None
    if state is not None:
        snapshot = state.current_snapshot() if as_of is None else state.snapshot_by_id(as_of)
    if snapshot is None:
        if as_of is not None:
            raise ConnectorError(
                f"table {names.state}: no snapshot {as_of}; `cdclake history` and Iceberg's "
                f"`{names.state}.snapshots` metadata table list the ones it has"
            )
        return None
    assert state is not None
    points = CLEANER_POINTS.read(state, snapshot_id=snapshot.snapshot_id) or {}
    return Horizon(snapshot.snapshot_id, datetime.fromtimestamp(snapshot.timestamp_ms / 1000, UTC), points)


def compacted_log(
    spark: SparkSession,
    catalog: Catalog,
    names: TableNames,
    partition: int | None = None,
    from_offset: int | None = None,
    as_of: int | None = None,
) -> DataFrame:
    """The compacted log (module docstring) as a Spark DataFrame of `COLUMNS`."""
    h = horizon(catalog, names, as_of)
    then = f"timestamp_millis({int(h.committed_at.timestamp() * 1000)})" if h is not None and as_of else None
    at = f" TIMESTAMP AS OF {then}" if then else ""  # the log and tombstones as they were then
    log = spark.sql(f"SELECT * FROM {names.spark(names.log)}{at}")
    live, points = None, {}
    if h is not None:
        points = h.cleaner_points
        meta = "_topic AS topic, _partition_id AS partition, _sequence_number AS sequence_number"
        state = spark.sql(f"SELECT {meta} FROM {names.spark(names.state)} VERSION AS OF {h.snapshot_id}")
        tombstones = spark.sql(
            f"SELECT {meta} FROM {names.spark(names.tombstones)}{at} WHERE expires_at > {then or 'current_timestamp()'}"
        )
        live = state.withColumn("_dead", F.lit(False)).unionByName(tombstones.withColumn("_dead", F.lit(True)))
    stream = F.concat_ws(":", F.col("topic"), F.col("partition").cast("string"))
    point = F.create_map(*[x for s, p in sorted(points.items()) for x in (F.lit(s), F.lit(p))]) if points else None
    head = log.where(F.col("sequence_number") >= F.coalesce(point[stream], F.lit(0))) if point is not None else log
    rows = head.select(*COLUMNS)
    if live is not None:
        cleaned = log.join(live, ["topic", "partition", "sequence_number"]).select(
            *COLUMNS[:-2],
            F.when(F.col("_dead"), F.lit(None).cast("binary")).otherwise(F.col("value")).alias("value"),
            F.col("_dead").alias("tombstone"),
        )
        rows = cleaned.unionByName(rows)
    if partition is not None:
        rows = rows.where(F.col("partition") == partition)
    if from_offset is not None:
        rows = rows.where(F.col("offset").cast("bigint") >= from_offset)
    return rows.orderBy("partition", "sequence_number")


def read_arrow(spark: SparkSession, catalog: Catalog, names: TableNames, **where: int | None) -> pa.Table:
    """`compacted_log` as an Arrow table (`partition`, `from_offset`, `as_of` as there)."""
    return compacted_log(spark, catalog, names, **where).toArrow()


def as_json(row: dict[str, Any]) -> dict[str, Any]:
    """A row as a JSON object: times in ISO 8601, the value as text where it is UTF-8, else
    in base64 as `value_base64` (nothing of the original bytes is lost either way)."""
    out = {k: v for k, v in row.items() if k != "value"}
    out["enqueued_time"] = row["enqueued_time"].isoformat()
    value = row["value"]
    if value is not None:
        try:
            out["value"] = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            out["value_base64"] = base64.b64encode(bytes(value)).decode()
    else:
        out["value"] = None
    return out


def rows(frame: DataFrame) -> Iterator[dict[str, Any]]:
    """The frame's rows in order, a partition of the result at a time (not all held at once)."""
    for row in frame.toLocalIterator(prefetchPartitions=True):
        yield row.asDict()

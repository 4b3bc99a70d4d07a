"""Shared pieces of the PySpark Python streaming data sources (Kafka, Event Hubs): the row
schema, record <-> row, and a driver that runs a source to its end with `availableNow`."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC
from typing import Any

from connector.core.records import SourceRecord

try:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
except ImportError:  # pragma: no cover - pyspark < 4
    DataSource = DataSourceStreamReader = InputPartition = object  # type: ignore[misc,assignment]

EVENT_SCHEMA = (
    "topic string, partition int, offset string, sequence_number bigint, enqueued_time timestamp, "
    "key binary, value binary, headers string"
)


def row_of(r: SourceRecord) -> tuple:
    headers = json.dumps({k: (v.decode("utf-8", "replace") if v is not None else None) for k, v in r.headers})
    return (
        r.topic,
        r.partition,
        r.offset,
        r.sequence_number,
        r.enqueued_time,
        r.key,
        r.value,
        headers if r.headers else None,
    )


def records_from_rows(rows: Sequence[Any]) -> list[SourceRecord]:
    out = []
    for r in rows:
        headers = (
            tuple((k, None if v is None else v.encode()) for k, v in json.loads(r["headers"]).items())
            if r["headers"]
            else ()
        )
        when = r["enqueued_time"].astimezone(UTC)  # PySpark hands out naive local time
        out.append(
            SourceRecord(
                r["topic"], r["partition"], r["offset"], r["sequence_number"], when, r["key"], r["value"], headers
            )
        )
    return out


def run_available_now(
    spark: Any, source: type[DataSource], options: Mapping[str, str], on_records: Callable[[list[SourceRecord]], None]
) -> None:
    """Runs the streaming data source `source` to the end offsets it sees at start, handing
    each micro-batch's records, in log order, to `on_records`."""
    spark.dataSource.register(source)

    def on_batch(df, _batch_id):
        records = records_from_rows(df.orderBy("topic", "partition", "sequence_number").collect())
        if records:
            on_records(records)

    with tempfile.TemporaryDirectory(prefix="cdclake-stream-") as checkpoint:
        # Spark's checkpoint is scratch: every run starts from the Iceberg tables' positions.
        query = (
            spark.readStream.format(source.name())
            .options(**options)
            .load()
            .writeStream.foreachBatch(on_batch)
            .trigger(availableNow=True)
            .option("checkpointLocation", checkpoint)
            .start()
        )
        try:
            query.awaitTermination()
        except Exception as e:
            raise _unwrap(e) from None


def _unwrap(e: Exception) -> Exception:
    """The connector's own error inside Spark's StreamingQueryException, else `e` itself."""
    import re

    from connector.core import errors

    m = re.search(r"connector\.core\.errors\.(\w+): ([^\n]*)", str(e))
    cls = getattr(errors, m.group(1), None) if m else None
    if m and isinstance(cls, type) and issubclass(cls, errors.ConnectorError) and cls is not errors.DecodeError:
        return cls(m.group(2))
    return e

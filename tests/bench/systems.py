"""The systems under comparison. Each takes the same generated stream and leaves its result
in a table; the harness times that, then reads the live keys each one ended with (untimed:
checking is not part of any system's work) to hold them to the same answer."""

from __future__ import annotations

import json
import os
import shutil
import time
from itertools import islice
from pathlib import Path

import orjson
import pyarrow as pa

from connector.app import run_compaction, run_ingest
from connector.core.config import Settings
from iceberg.catalog import load_catalog

PAYLOAD = "struct<op:string, after:struct<id:bigint, v:bigint, pad:string>, source:struct<lsn:bigint>>"


def table_files(settings: Settings, name: str) -> tuple[int, int]:
    """(data + delete files, bytes) of the current snapshot."""
    t = load_catalog(settings).load_table(name)
    snap = t.current_snapshot()
    if snap is None:
        return 0, 0
    p = snap.summary.additional_properties
    return int(p.get("total-data-files", 0)) + int(p.get("total-delete-files", 0)), int(p.get("total-files-size", 0))


def drop_namespace(settings: Settings) -> None:
    catalog = load_catalog(settings)
    ns = settings.catalog.namespace
    if ns in {n[0] for n in catalog.list_namespaces()}:
        for ident in catalog.list_tables(ns):
            catalog.purge_table(ident)


def ours_ingest(settings: Settings) -> None:
    run_ingest(settings)


def produce_to_kafka(bootstrap: str, topic: str, src: Path, partitions: int) -> int:
    """The stream's lines into a new topic (input preparation, not timed): each line's key and
    payload to its partition, in file order, so the broker's offsets are the file's."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        f.result(60)
    # idempotent: a retried batch cannot land after the next one, so each partition's offsets
    # stay in the file's (and the source positions') order
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.num.messages": 10000,
            "acks": "all",
            "enable.idempotence": True,
        }
    )
    n = 0
    with src.open("rb") as f:
        for line in f:
            r = orjson.loads(line)
            while True:
                try:
                    p.produce(topic, key=r["key"], value=r["payload"], partition=r["partition"])
                    break
                except BufferError:
                    p.poll(0.1)
            n += 1
            if n % 10000 == 0:
                p.poll(0)
    if p.flush(300):
        raise RuntimeError("the benchmark's events were not all delivered to the broker")
    return n


def delete_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the answer came
    for f in admin.delete_topics([topic]).values():
        f.result(60)


def log_rows(settings: Settings) -> int:
    t = load_catalog(settings).load_table(f"{settings.catalog.namespace}.items__log")
    return t.scan(selected_fields=("sequence_number",)).to_arrow().num_rows


def ours_compact(settings: Settings) -> None:
    run_compaction(settings, ["items"], force=True)


def live(settings: Settings, table: str, key: str) -> set[str]:
    """The keys of an Iceberg table of the namespace (what a system ended with)."""
    t = load_catalog(settings).load_table(f"{settings.catalog.namespace}.{table}")
    return set(t.scan(selected_fields=(key,)).to_arrow()[key].to_pylist())


def check_live(settings: Settings, table: str, key: str, expected: set[str], src: Path, who: str) -> None:
    """Hold a system's live keys to the model's; on a difference, name the keys with the
    stream's events for them and, where the namespace has one, this pipeline's log rows."""
    got = live(settings, table, key)
    if got == expected:
        return
    missing, extra = sorted(expected - got), sorted(got - expected)
    shown = set(missing[:3] + extra[:3])
    lines = [f"{who} disagrees with the model: {len(missing)} live keys missing, {len(extra)} extra"]
    with src.open() as f:
        for line in f:
            r = json.loads(line)
            if r["key"] in shown:
                op = "tombstone" if r["payload"] is None else json.loads(r["payload"])["op"]
                lines.append(f"  stream {r['key']} p{r['partition']}@{r['offset']} {op}")
    catalog = load_catalog(settings)
    log = f"{settings.catalog.namespace}.items__log"
    if catalog.table_exists(log):
        cols = ("key", "partition", "offset", "sequence_number", "op", "tombstone", "source_position")
        for r in catalog.load_table(log).scan(selected_fields=cols).to_arrow().to_pylist():
            if r["key"] in shown:
                lines.append(f"  log    {r}")
    raise AssertionError("\n".join(lines))


def split_files(src: Path, out: Path, batch: int) -> Path:
    """The stream as one JSON-lines file per micro-batch (input preparation, not timed), each
    modified a second after the one before: Spark's file source takes files in the order of
    their modification times, and files written within a clock tick of each other tie."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    start = time.time()
    with src.open() as f:
        i = 0
        while chunk := list(islice(f, batch)):
            part = out / f"part-{i:06d}.json"
            part.write_text("".join(chunk))
            os.utime(part, (start + i, start + i))
            i += 1
    return out


def naive_spark_merge(spark, settings: Settings, batches_dir: Path, checkpoint: Path) -> None:
    """What most users write first: Structured Streaming, foreachBatch, dedupe the batch, MERGE INTO."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    target = f"{settings.catalog.namespace}.naive_items"
    spark.sql(f"DROP TABLE IF EXISTS {target}")
    spark.sql(f"CREATE TABLE {target} (k string, id bigint, v bigint, pad string, lsn bigint) USING iceberg")

    def merge(df, _batch_id):
        parsed = df.select(F.col("key").alias("k"), "partition", "offset", F.from_json("payload", PAYLOAD).alias("p"))
        rows = parsed.select(
            "k",
            "partition",
            "offset",
            F.coalesce(F.col("p.op"), F.lit("d")).alias("op"),
            "p.after.id",
            "p.after.v",
            "p.after.pad",
            F.col("p.source.lsn").alias("lsn"),
        )
        latest = rows.withColumn(
            "rn",
            F.row_number().over(Window.partitionBy("k").orderBy(F.col("partition").desc(), F.col("offset").desc())),
        ).where("rn = 1")
        latest.createOrReplaceTempView("naive_batch")
        df.sparkSession.sql(
            f"MERGE INTO {target} t USING naive_batch s ON t.k = s.k "
            "WHEN MATCHED AND s.op = 'd' THEN DELETE "
            "WHEN MATCHED THEN UPDATE SET t.id = s.id, t.v = s.v, t.pad = s.pad, t.lsn = s.lsn "
            "WHEN NOT MATCHED AND s.op != 'd' THEN INSERT (k, id, v, pad, lsn) VALUES (s.k, s.id, s.v, s.pad, s.lsn)"
        )

    shutil.rmtree(checkpoint, ignore_errors=True)
    query = (
        spark.readStream.schema("topic string, partition int, offset bigint, ts bigint, key string, payload string")
        .option("maxFilesPerTrigger", 1)
        .json(str(batches_dir))
        .writeStream.foreachBatch(merge)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    query.awaitTermination()


def pyiceberg_upsert(settings: Settings, src: Path, batch: int) -> None:
    """What a Python user reaches for: `table.upsert` per batch (plus `delete` for deletes)."""
    from pyiceberg.expressions import In

    catalog = load_catalog(settings)
    name = f"{settings.catalog.namespace}.upsert_items"
    if catalog.table_exists(name):
        catalog.drop_table(name)
    schema = pa.schema(
        [
            pa.field("k", pa.string(), nullable=False),
            pa.field("id", pa.int64()),
            pa.field("v", pa.int64()),
            pa.field("pad", pa.string()),
            pa.field("lsn", pa.int64()),
        ]
    )
    table = catalog.create_table(name, schema=schema)

    with table.update_schema() as u:
        u.set_identifier_fields("k")
    with src.open() as f:
        while chunk := list(islice(f, batch)):
            latest: dict[str, dict | None] = {}
            for line in chunk:  # a batch may not hold a key twice for upsert
                r = orjson.loads(line)
                doc = orjson.loads(r["payload"]) if r["payload"] else None
                latest[r["key"]] = (
                    None
                    if doc is None or doc["op"] == "d"
                    else {"k": r["key"], **doc["after"], "lsn": doc["source"]["lsn"]}
                )
            live = [v for v in latest.values() if v is not None]
            gone = [k for k, v in latest.items() if v is None]
            if live:
                table.upsert(pa.Table.from_pylist(live, schema=schema), join_cols=["k"])
            if gone:
                table.delete(In("k", gone))


def to_parquet(src: Path, dst: Path) -> Path:
    """The stream's (key, partition, offset, op) in Parquet (input preparation, not timed)."""
    import pyarrow.parquet as pq

    cols: dict[str, list] = {"k": [], "p": [], "off": [], "op": []}
    with src.open() as f:
        for line in f:
            r = orjson.loads(line)
            cols["k"].append(r["key"])
            cols["p"].append(r["partition"])
            cols["off"].append(r["offset"])
            cols["op"].append("d" if r["payload"] is None else json.loads(r["payload"])["op"])
    pq.write_table(pa.table(cols), dst)
    return dst


def duckdb_floor(parquet: Path):
    """The floor for the dedupe step: DuckDB latest-per-key over events already in Parquet,
    into an in-memory table (returned: its connection, for `duckdb_live`)."""
    import duckdb

    con = duckdb.connect()
    con.execute(f"CREATE TABLE latest AS SELECT k, arg_max(op, off) AS op FROM read_parquet('{parquet}') GROUP BY k")
    return con


def duckdb_live(con) -> set[str]:
    return {r[0] for r in con.execute("SELECT k FROM latest WHERE op != 'd'").fetchall()}

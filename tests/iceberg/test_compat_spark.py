"""Contract tests of `iceberg/compat_spark.py` on PySpark and py4j: each internal it uses, on the
installed (pinned) versions (`test_compat.py` holds pyiceberg's and says what a failure means)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from connector.core.errors import SourceError
from connector.stage import WRITTEN_SCHEMA
from iceberg import compat_spark
from iceberg.spark import DEFAULT_JARS_DIR
from tests.iceberg.test_compat import contract


def test_an_arrow_schema_is_sparks_schema_of_the_same_columns():
    from pyspark.sql.types import BinaryType, BooleanType, IntegerType, LongType, StringType, StructField, StructType

    types = {
        pa.string(): StringType(),
        pa.int32(): IntegerType(),
        pa.int64(): LongType(),
        pa.bool_(): BooleanType(),
        pa.binary(): BinaryType(),
    }
    assert {f.type for f in WRITTEN_SCHEMA} <= set(types)  # what the stage gives back is covered
    arrow = pa.schema([pa.field(str(i), t, nullable=bool(i % 2)) for i, t in enumerate(types)])
    want = StructType([StructField(str(i), t, nullable=bool(i % 2)) for i, t in enumerate(types.values())])
    with contract("sql.pandas.types.from_arrow_schema", "pyspark"):
        assert compat_spark.spark_schema(arrow) == want


@pytest.mark.spark
def test_persisted_rdds_are_listed_and_released_through_the_jvm_context(spark):
    with contract("SparkContext._jsc.getPersistentRDDs", "pyspark"):
        before = compat_spark.persisted_rdds(spark)
        spark.range(10).localCheckpoint(eager=True)
        made = compat_spark.persisted_rdds(spark) - before
        assert made, "a local checkpoint is a persisted RDD"
        compat_spark.unpersist_rdds(spark, keep=before)
        assert compat_spark.persisted_rdds(spark) == before


@pytest.mark.spark
def test_a_sequence_of_columns_built_once_selects_as_pysparks_select_in_any_session(spark):
    """`compat_spark.column_seq` and `compat_spark.select`: the same rows and names as PySpark's `select`
    of those columns, again and again, from a frame of another session too."""
    from pyspark.sql import functions as F

    with contract("pyspark.sql.classic.column._to_seq, DataFrame._jdf.select", "pyspark"):
        columns = [F.col("id").alias("a"), (F.col("id") * 2).alias("b"), F.lit("x").alias("c")]
        seq = compat_spark.column_seq(columns)
        for session in (spark, spark.newSession()):
            frame = session.range(3)
            got = compat_spark.select(frame, seq)
            assert got.columns == ["a", "b", "c"]
            assert got.collect() == frame.select(*columns).collect() == [(i, 2 * i, "x") for i in range(3)]
            assert got.sparkSession is session


@pytest.mark.spark
def test_frames_reach_the_delta_writer_which_fails_where_another_writer_committed_since_its_base(spark, settings):
    """`compat_spark.delta_commit` hands the changes to infra/delta-writer in the JVM: the rows whose
    action is kept are added, and every row a changed key held is removed by its position. The
    write validates from the snapshot those positions were read at, so a writer that lost its
    lease cannot remove or add rows over another's commit, nor change the columns. Columns
    added (in their order) and widened go in the same snapshot as the rows."""
    from pyspark.sql import functions as F

    table = f"{settings.catalog.name}.{settings.catalog.namespace}.fenced"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog.name}.{settings.catalog.namespace}")
    spark.sql(f"CREATE TABLE {table} (_key string, v bigint, i int) USING iceberg TBLPROPERTIES ('format-version'='3')")
    spark.sql(f"INSERT INTO {table} VALUES ('a', 1, 1), ('b', 2, 2)")
    base = spark.sql(f"SELECT snapshot_id FROM {table}.snapshots").first()[0]
    at = dict(spark.table(table).select("_key", F.struct("_file", "_pos")).collect())
    spark.sql(f"INSERT INTO {table} VALUES ('c', 3, 3)")  # the other writer
    changes = spark.createDataFrame(
        [("a", 10, 2**40, "x", 1.5, "upsert", (at["a"],)), ("b", None, None, None, None, "delete", (at["b"],))],
        "_key string, v bigint, i bigint, w string, `z.y` double, _action string,"
        " _held struct<_at: struct<_file: string, _pos: bigint>>",
    )
    add, widen = {"w": "string", "z.y": "double"}, {"i": "bigint"}
    with pytest.raises(Exception, match="conflicting files"):
        compat_spark.delta_commit(changes, table, "upsert", "_held", {"k": "v"}, base, add, widen)
    assert sorted(map(tuple, spark.table(table).collect())) == [("a", 1, 1), ("b", 2, 2), ("c", 3, 3)]
    snapshots = f"SELECT count(*) FROM {table}.snapshots"
    now, count = spark.sql(f"SELECT max_by(snapshot_id, committed_at), count(*) FROM {table}.snapshots").first()
    with contract("DataFrame._jdf, SparkSession._jsparkSession, SparkContext._jvm", "pyspark"):
        # read again, it commits
        compat_spark.delta_commit(changes, table, "upsert", "_held", {"k": "v"}, now, add, widen)
    assert spark.sql(snapshots).first()[0] == count + 1
    assert spark.table(table).dtypes == [
        ("_key", "string"),
        ("v", "bigint"),
        ("i", "bigint"),
        ("w", "string"),
        ("z.y", "double"),
    ]
    assert sorted(map(tuple, spark.table(table).collect())) == [
        ("a", 10, 2**40, "x", 1.5),
        ("c", 3, 3, None, None),
    ]
    latest = f"SELECT snapshot_id, summary FROM {table}.snapshots ORDER BY committed_at DESC LIMIT 1"
    now, summary = spark.sql(latest).first()
    assert summary["k"] == "v" and int(summary["added-dvs"]) >= 1
    # nothing: a snapshot
    compat_spark.delta_commit(changes.limit(0), table, "upsert", "_held", {"k": "w"}, now, {}, {})
    assert spark.sql(latest).first()[1]["k"] == "w"
    assert len(spark.table(table).collect()) == 2


@pytest.mark.spark
def test_the_delta_writers_data_files_copy_one_loaded_hadoop_configuration(spark):
    """infra/delta-writer gives each data file's Parquet writer a copy of one loaded Hadoop
    configuration, set into the `conf` field of Iceberg's `Parquet.WriteBuilder` (private):
    without it each writer parses Hadoop's default XML resources again, about 10 ms a file.
    Where the field is gone the writer falls back to Iceberg's own (the test above still
    writes), and this test says so."""
    jar = next(DEFAULT_JARS_DIR.glob("iceberg-spark-runtime-*.jar")).name
    assert compat_spark._helper(spark, "DeltaWriter").sharesHadoopConf(), (
        f"org.apache.iceberg.parquet.Parquet$WriteBuilder of {jar} has no Configuration field named conf: "
        "adapt infra/delta-writer/DeltaWriter.java (writerConf) before upgrading"
    )


@pytest.mark.spark
def test_a_python_workers_error_reaches_the_driver_with_its_class_and_message(spark):
    def fail(batches):
        for _ in batches:
            raise SourceError("offsets [0, 5) of t:0 cannot be read: gone")
        yield from ()

    with contract("the text of a Python worker's error (PythonException)", "pyspark"):
        with pytest.raises(Exception) as raised:
            spark.range(1).mapInArrow(fail, "id long").collect()
        assert compat_spark.raised_in_python_worker(raised.value, "connector.core.errors") == (
            "SourceError",
            "offsets [0, 5) of t:0 cannot be read: gone",
        ), str(raised.value)[-2000:]


@pytest.mark.spark
def test_the_jvm_started_with_its_output_redirected_is_the_one_spark_uses_and_stops_with_it(spark, tmp_path):
    """In a process of its own: this one's JVM is running already."""
    assert compat_spark.jvm_started()
    log = tmp_path / "jvm.log"
    script = textwrap.dedent(
        f"""
        import os

        from pyspark import SparkConf, SparkContext
        from iceberg import compat_spark

        assert not compat_spark.jvm_started()
        conf = SparkConf(loadDefaults=False).setAppName("compat").setMaster("local[1]")
        with open({str(log)!r}, "ab") as out:
            gateway = compat_spark.start_jvm(conf, out)
        assert compat_spark.jvm_started()
        gateway.jvm.System.out.println("from the jvm")
        gateway.jvm.System.out.flush()
        sc = SparkContext(conf=conf)
        assert sc._gateway is gateway, "SparkContext started a JVM of its own"
        pid = gateway.jvm.ProcessHandle.current().pid()
        from pyspark.sql import SparkSession

        assert compat_spark.stop_jvm(SparkSession(sc), timeout=60) == 0
        try:
            os.kill(pid, 0)
            raise AssertionError("the JVM still runs")
        except ProcessLookupError:
            pass
        """
    )
    root = Path(__file__).resolve().parents[2]
    with contract("java_gateway.launch_gateway + SparkContext._ensure_initialized / _gateway (.proc)", "pyspark"):
        done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "from the jvm" in log.read_text(), "the JVM's output did not go where it was sent"


@pytest.mark.spark
def test_a_shared_reads_session_compiles_no_code_for_its_queries(spark):
    """`compat_spark.NO_CODEGEN` in the sessions `round_session(small=True)` gives, told by Spark's
    own count of compilations (`CodegenMetrics`, through the JVM); a round's other session
    compiles its query. `factoryMode` is internal to Spark: it exists with its options."""
    from pyspark.sql import functions as F

    from iceberg.spark import round_session

    jvm = spark.sparkContext._jvm
    compilations = jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()

    def compiled(session, n: int) -> int:  # `n` new to each query: no compiled class fits it
        before = compilations.getCount()
        rows = session.range(100).selectExpr(f"id * {n} AS x").where(f"x % 7 = {n % 7}")
        assert rows.groupBy(F.col("x") % 3).count().count() >= 1
        return compilations.getCount() - before

    with contract("the setting spark.sql.codegen.factoryMode", "pyspark"):
        with round_session(spark, own=True, small=True) as small:
            compiled(small, 1_000_003)  # its first query may compile what every query shares
            assert compiled(small, 1_000_033) == 0
            with pytest.raises(Exception, match="NO_CODEGEN"):
                small.conf.set("spark.sql.codegen.factoryMode", "EVERY_OTHER")
    with round_session(spark, own=True) as other:
        assert other is not small
        assert compiled(other, 1_000_037) > 0


@pytest.mark.spark
def test_tables_made_through_sparks_catalog_api_are_the_ones_create_table_makes(spark, settings):
    """`compat_spark.create_tables` against Spark's own `CREATE TABLE IF NOT EXISTS`: the same
    columns (names, types, field ids, nullability) and properties; a table that exists is left
    as it is, rows and all."""
    from iceberg.catalog import load_catalog

    ns, columns = settings.catalog.namespace, "`_key` string, `v.w` bigint not null, `at` timestamp"
    properties = {"format-version": "3", "write.merge.mode": "merge-on-read"}
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog.name}.{ns}")
    spark.sql(
        f"CREATE TABLE {settings.catalog.name}.{ns}.by_sql ({columns}) USING iceberg "
        "TBLPROPERTIES ('format-version'='3', 'write.merge.mode'='merge-on-read')"
    )
    spark.sql(f"INSERT INTO {settings.catalog.name}.{ns}.by_sql VALUES ('a', 1, null)")
    with contract("SparkSession._jsparkSession, SparkContext._jvm", "pyspark"):
        made = {f"{ns}.by_api": columns, f"{ns}.by_sql": "x int"}
        compat_spark.create_tables(spark, settings.catalog.name, made, properties)
    catalog = load_catalog(settings)
    by_sql, by_api = catalog.load_table(f"{ns}.by_sql"), catalog.load_table(f"{ns}.by_api")
    assert by_api.schema() == by_sql.schema()
    assert [f.required for f in by_api.schema().fields] == [False, True, False]
    assert by_api.format_version == by_sql.format_version == 3
    assert {k: v for k, v in by_api.properties.items() if k != "owner"} == {
        k: v for k, v in by_sql.properties.items() if k != "owner"
    }
    assert by_api.current_snapshot() is None
    assert by_sql.scan().to_arrow().num_rows == 1  # left as it was


@pytest.mark.spark
def test_the_jvm_read_gives_the_rows_sparks_scans_give(spark, settings):
    """Two tables compacted twice (the second round replaces a held row: a deletion vector;
    their logs and states hold several manifests each).
    The read in the driver's JVM of their logs' ranges, then of their states' and tombstones'
    rows for those ranges' keys, equals Spark's scans of the same tables (`_file` and `_pos`
    with the held rows), each table's keys prefixed with its own prefix."""
    from collections import Counter

    from pyspark.sql import functions as F

    from connector.app import run_compaction
    from iceberg.compaction import winners
    from tests.iceberg.helpers import NOW, names, run_ingest, with_source, write_lines
    from tests.iceberg.test_many_tables import STREAM, _lake
    from tests.iceberg.test_property import to_lines

    tables = ["j0", "j1"]
    s, _ = _lake(settings, tables, "jvm", STREAM[:3])
    run_ingest(s)
    run_compaction(s, force=True, now=NOW)
    path = write_lines(
        Path(tempfile.mkdtemp()) / "all.jsonl", [x for t in tables for x in to_lines(STREAM, "source", t)]
    )
    s = with_source(s, path)
    run_ingest(s)
    run_compaction(s, force=True, now=NOW)
    ns = [names(s, t) for t in tables]
    snapshots = spark.sql(f"SELECT summary FROM {ns[0].spark(ns[0].state)}.snapshots").collect()
    assert int(snapshots[-1][0]["total-position-deletes"]) > 0  # read through a deletion vector
    for n in ns:  # each scan planned over several manifests (in the reading thread: `Reads.planningHere`)
        assert spark.sql(f"SELECT count(*) FROM {n.spark(n.log)}.manifests").first()[0] > 1
        assert spark.sql(f"SELECT count(*) FROM {n.spark(n.state)}.manifests").first()[0] > 1

    def rows(frame):
        return Counter(tuple(tuple(v) if isinstance(v, list) else v for v in r) for r in frame.collect())

    streams = [spark.table(n.spark(n.log)).select("topic", "partition").distinct().collect() for n in ns]
    ranges = [[x for t, p in found for x in (t, p, 1, 100)] for found in streams]  # each stream's first event left out
    columns = [c for c, _ in winners.LOG_CANDIDATES]
    prefixes = [f"{i}/" for i in range(len(tables))]
    events, held = compat_spark.jvm_reads(spark, [n.spark(n.log) for n in ns], prefixes, ranges, columns)
    scans = [
        spark.table(n.spark(n.log)).where("sequence_number >= 1 AND sequence_number < 100").select(*columns) for n in ns
    ]
    prefixed = [scan.withColumn("key", F.concat(F.lit(p), "key")) for p, scan in zip(prefixes, scans)]
    assert rows(events) == sum((rows(x) for x in prefixed), Counter()) and len(rows(events)) > 2
    for kind in ("state", "tombstones"):
        got = held([n.spark(getattr(n, kind)) for n in ns], winners.HELD_READS)
        want = Counter()
        for p, n, scan in zip(prefixes, ns, scans):
            table = spark.table(n.spark(getattr(n, kind))).select(*winners.HELD_READS, "_file", "_pos")
            kept = table.join(scan.select(F.col("key").alias("_key")).distinct(), "_key", "left_semi")
            want += rows(kept.withColumn("_key", F.concat(F.lit(p), "_key")))
        assert rows(got) == want and want


def test_a_local_driver_has_the_jars_on_its_class_path_after_sparks_own_and_the_class_archive(tmp_path, monkeypatch):
    """A local driver this process starts: the jars on its class path after Spark's own, then
    the configuration's; the class archive beside the jars, if there, unless the configuration's
    JVM options name one. Under spark-submit or for a cluster: `spark.jars`, then the
    configuration's."""
    from connector.core.config import load_settings
    from iceberg.spark import CLASS_ARCHIVE, JAVA_OPTIONS, SHORT_LIVED_OPTIONS, driver_conf, short_lived

    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    jars = tmp_path / "jars space"
    jars.mkdir()
    names = [str(jars / n) for n in ("cdclake-delta-writer.jar", "iceberg-spark-runtime-x.jar")]
    for n in names:
        Path(n).write_bytes(b"")
    spark_jars = str(Path(compat_spark.spark_home()) / "jars" / "*")
    assert list((Path(compat_spark.spark_home()) / "jars").glob("spark-core_*.jar")), "PySpark's own lookup"

    def conf(**spark):
        return driver_conf(load_settings(work_dir=tmp_path, spark={"jars_dir": str(jars), **spark}))

    local = {"spark.driver.extraClassPath": ":".join([spark_jars, *names])}
    local["spark.driver.extraJavaOptions"] = JAVA_OPTIONS
    assert conf() == conf(master="local[2]") == local
    (jars / CLASS_ARCHIVE).write_bytes(b"")
    archive = f"-XX:SharedArchiveFile='{jars / CLASS_ARCHIVE}'"
    assert conf() == local | {"spark.driver.extraJavaOptions": f"{JAVA_OPTIONS} {archive}"}
    own = {"spark.driver.extraClassPath": "/x.jar", "spark.driver.extraJavaOptions": "-Xmx1g"}
    assert conf(conf=own) == {
        "spark.driver.extraClassPath": ":".join([spark_jars, *names, "/x.jar"]),
        "spark.driver.extraJavaOptions": f"-Xmx1g {archive}",
    }
    assert conf(conf={"spark.driver.extraJavaOptions": "-Xshare:off"})["spark.driver.extraJavaOptions"] == "-Xshare:off"
    short_lived()  # a process running one command: C1 alone, unless the configuration gives options
    quick = f"{JAVA_OPTIONS} {SHORT_LIVED_OPTIONS}"
    assert conf() == local | {"spark.driver.extraJavaOptions": f"{quick} {archive}"}
    assert conf(conf=own)["spark.driver.extraJavaOptions"] == f"-Xmx1g {archive}"
    assert conf(master="spark://127.0.0.1:7077")["spark.driver.extraJavaOptions"] == quick
    short_lived(False)
    shipped = {"spark.jars": ",".join(names), "spark.driver.extraJavaOptions": JAVA_OPTIONS}
    assert conf(master="spark://127.0.0.1:7077") == conf(master="k8s://https://h:443") == shipped
    assert conf(master="spark://h:7077", conf={"spark.jars": "/x.jar"})["spark.jars"] == ",".join([*names, "/x.jar"])
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    assert conf() == shipped


@pytest.mark.spark
def test_the_sessions_jvm_maps_the_class_archive_and_gets_sparks_classes_first(spark):
    """The session's JVM was started with the class archive set-up wrote (infra/class_archive.py),
    which a JVM of its class path maps (`-Xshare:on` fails where it cannot); a class both Spark
    and a bundle carry (the AWS bundle's older commons-codec) is Spark's."""
    from iceberg.spark import CLASS_ARCHIVE, DEFAULT_JARS_DIR

    archive = DEFAULT_JARS_DIR / CLASS_ARCHIVE
    assert archive.is_file(), "no class archive: `bash infra/fetch-jars.sh` writes it"
    jvm = spark.sparkContext._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={archive}" in arguments
    java = Path(jvm.System.getProperty("java.home")) / "bin" / "java"
    classes = jvm.System.getProperty("java.class.path")
    command = [java, "-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-cp", classes, "-version"]
    mapped = subprocess.run(command, capture_output=True, text=True)
    assert mapped.returncode == 0, mapped.stdout + mapped.stderr
    codec = jvm.java.lang.Class.forName("org.apache.commons.codec.binary.Hex")
    source = str(codec.getProtectionDomain().getCodeSource().getLocation().getPath())
    assert "/pyspark/jars/commons-codec-" in source, source

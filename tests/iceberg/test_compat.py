"""Contract tests of `iceberg/compat.py`: each library internal it uses, on the installed
(pinned) versions. A failure names the internal and the version: an upgrade changed it, and
compat.py must follow (or move to a public API) before the upgrade goes in."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import GreaterThan
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.types import LongType

from connector.core.errors import SourceError
from connector.sinks import Sinks
from connector.stage import WRITTEN_SCHEMA
from iceberg import compat
from iceberg.layouts import DEAD_LETTER_SCHEMA, LOG_SCHEMA
from iceberg.log_writer import commit_data_files


@contextmanager
def contract(internal: str, library: str) -> Iterator[None]:
    """Any failure inside, said as the internal that changed and the version that changed it."""
    try:
        yield
    except Exception as e:
        raise AssertionError(
            f"{internal} of {library} {version(library)} no longer does what iceberg/compat.py relies on "
            f"({type(e).__name__}: {e}); adapt compat.py (or use a public API) before upgrading"
        ) from e


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    catalog = SqlCatalog("compat", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("ns")
    return catalog


def file_fields(f) -> tuple:
    return (
        f.content,
        f.file_path,
        f.file_format,
        f.partition,
        f.record_count,
        f.file_size_in_bytes,
        f.column_sizes,
        f.value_counts,
        f.null_value_counts,
        f.nan_value_counts,
        f.lower_bounds,
        f.upper_bounds,
        f.split_offsets,
        f.sort_order_id,
        f.equality_ids,
        f.key_metadata,
    )


def test_the_libraries_are_the_versions_the_contracts_were_checked_on():
    for library, checked in compat.CHECKED_AGAINST.items():
        assert version(library) == checked, (
            f"{library} is {version(library)}, iceberg/compat.py was checked on {checked}: run "
            "tests/iceberg/test_compat.py (with -m spark) on it, then update compat.CHECKED_AGAINST"
        )


def test_a_new_tables_metadata_is_the_one_create_table_gives(catalog, tmp_path):
    with contract("Catalog._convert_schema_if_needed + table.metadata.new_table_metadata", "pyiceberg"):
        for name, layout in (("a__log", LOG_SCHEMA), ("a__dead_letters", DEAD_LETTER_SCHEMA)):
            location = (tmp_path / name).as_uri()
            made = compat.new_table_metadata(layout, location)
            table = catalog.create_table(("ns", name), schema=layout, location=location)
            assert made.schema() == table.schema()  # field ids included: what `FileTarget.fits` checks
            assert (made.location, made.default_spec_id, made.properties) == (
                table.location(),
                table.spec().spec_id,
                table.properties,
            )


def test_a_written_file_crosses_as_json_and_is_the_data_file_pyiceberg_reads_from_it(catalog):
    table = catalog.create_table(("ns", "t"), schema=pa.schema([("id", pa.int64()), ("s", pa.string())]))
    rows = pa.table({"id": [3, None, 1], "s": ["b", "a", None]}, schema=table.schema().as_arrow())
    with contract("io.fileformat FileFormatFactory / create_writer / to_serialized_dict", "pyiceberg"):
        out = compat.ParquetDataFile(table.metadata, table.io)
        out.write(rows.slice(0, 2))
        out.write(rows.slice(2))
        blob = compat.encode_data_files([out.close()])
    described = json.loads(blob)  # plain JSON: nothing of pyiceberg's classes crosses
    assert [f["record_count"] for f in described] == [3]
    assert compat.data_file_paths(blob) == [out.path]
    with contract("manifest.DataFile.from_args + the snapshot producer's fast_append", "pyiceberg"):
        (decoded,) = compat.decode_data_files(blob)
        # pyiceberg's own description of the file, read from its footer (what `add_files` does)
        assert file_fields(decoded) == file_fields(parquet_file_to_data_file(table.io, table.metadata, out.path))
        commit_data_files(table, [blob], {"k": "v"}, "main")
        table = catalog.load_table(("ns", "t"))
        (task,) = table.scan().plan_files()
        assert file_fields(task.file) == file_fields(decoded)
        assert table.scan().to_arrow().sort_by("s").to_pylist() == rows.sort_by("s").to_pylist()


def test_the_encoding_is_the_projects_own_and_decodes_as_written():
    low, high = (5).to_bytes(8, "little"), (9).to_bytes(8, "little")
    blob = json.dumps(
        [
            {
                "file_path": "file:///w/ns/t/data/f.parquet",
                "file_size_in_bytes": 100,
                "spec_id": 0,
                "record_count": 2,
                "column_sizes": {"1": 10},
                "value_counts": {"1": 2},
                "null_value_counts": {"1": 0},
                "nan_value_counts": {},
                "lower_bounds": {"1": base64.b64encode(low).decode()},
                "upper_bounds": {"1": base64.b64encode(high).decode()},
                "split_offsets": [4],
            }
        ]
    ).encode()
    with contract("manifest.DataFile.from_args", "pyiceberg"):
        (f,) = compat.decode_data_files(blob)
        assert (f.file_path, f.file_size_in_bytes, f.record_count, f.split_offsets) == (
            "file:///w/ns/t/data/f.parquet",
            100,
            2,
            [4],
        )
        counts = (f.column_sizes, f.value_counts, f.null_value_counts, f.nan_value_counts)
        assert counts == ({1: 10}, {1: 2}, {1: 0}, {})
        assert (f.lower_bounds, f.upper_bounds) == ({1: low}, {1: high})
    assert compat.encode_data_files([]) == b"[]" and compat.decode_data_files(b"[]") == []


def test_some_of_a_scans_files_are_read_with_its_filter_and_projection(catalog):
    table = catalog.create_table(("ns", "t"), schema=pa.schema([("id", pa.int64()), ("s", pa.string())]))
    for ids in ([1, 2], [3, 4], [5, 6]):
        table.append(pa.table({"id": ids, "s": [str(i) for i in ids]}, schema=table.schema().as_arrow()))
    scan = table.scan(row_filter=GreaterThan("id", 1), selected_fields=("id",))
    tasks = sorted(scan.plan_files(), key=lambda t: t.file.file_path)
    with contract("io.pyarrow.ArrowScan", "pyiceberg"):
        read = compat.file_reader(scan)
        some = [t for t in tasks if t.file.lower_bounds[1] != (3).to_bytes(8, "little", signed=True)]
        assert sorted(read(some)["id"].to_pylist()) == [2, 5, 6]
        assert read(tasks).column_names == ["id"]
        assert read(tasks).sort_by("id") == scan.to_arrow().sort_by("id")


def test_a_snapshot_on_moved_metadata_is_told_by_its_error_text(catalog):
    table = catalog.create_table(("ns", "t"), schema=pa.schema([("x", pa.int64())]))
    table.append(pa.table({"x": [1]}))
    table = catalog.load_table(("ns", "t"))
    table.manage_snapshots().create_branch(table.current_snapshot().snapshot_id, "run").commit()
    stale = catalog.load_table(("ns", "t"))
    catalog.load_table(("ns", "t")).append(pa.table({"x": [2]}))  # another commit moves `main`
    with contract("the ValueError of a snapshot on moved metadata (table.update)", "pyiceberg"):
        with pytest.raises(ValueError) as raised:
            stale.append(pa.table({"x": [3]}), branch="run")
        assert compat.is_stale_snapshot(raised.value), str(raised.value)
    assert not compat.is_stale_snapshot(ValueError("another problem"))


def test_a_commit_without_retries_fails_where_main_moved_and_pyiceberg_would_retry_it(catalog):
    from pyiceberg.exceptions import CommitFailedException

    table = catalog.create_table(("ns", "r"), schema=pa.schema([("x", pa.int64())]))
    table.append(pa.table({"x": [1]}))
    stale, retried = catalog.load_table(("ns", "r")), catalog.load_table(("ns", "r"))
    catalog.load_table(("ns", "r")).append(pa.table({"x": [2]}))  # another commit moves `main`
    with contract("commit.retry.num-retries of the held metadata, read by the client's retry", "pyiceberg"):
        with pytest.raises(CommitFailedException):
            compat.without_retries(stale).append(pa.table({"x": [3]}))
        retried.append(pa.table({"x": [4]}))  # pyiceberg's own: rebuilt on top of the newer `main`
    assert sorted(catalog.load_table(("ns", "r")).scan().to_arrow()["x"].to_pylist()) == [1, 2, 4]


def test_shared_metadata_is_never_copied_and_commits_as_pyicebergs_own(catalog, monkeypatch):
    import copy

    from pydantic import BaseModel
    from pyiceberg.table.metadata import TableMetadataCommonFields

    for name in ("ours", "theirs"):
        catalog.create_table(("ns", name), schema=pa.schema([("x", pa.int64())])).append(pa.table({"x": [1]}))
    copies = []
    deepcopy = BaseModel.__deepcopy__

    def counted(self, memo=None):
        if isinstance(self, TableMetadataCommonFields):
            copies.append(type(self).__name__)
        return deepcopy(self, memo)

    monkeypatch.setattr(BaseModel, "__deepcopy__", counted)

    class Parsing(compat.MetadataParsedOnce, SqlCatalog):
        pass

    def commit(table) -> None:
        table.append(pa.table({"x": [2]}), snapshot_properties={"k": "v"})
        with table.update_schema() as update:
            update.add_column("y", LongType())
        table.transaction().set_properties(p="q").commit_transaction()

    with contract("metadata changed by new models (update_table_metadata's deep copy)", "pyiceberg"):
        commit(catalog.load_table(("ns", "theirs")))
        assert copies, "pyiceberg's own commits deep-copy the metadata"
        copies.clear()
        ours = compat.without_retries(Parsing("compat", **catalog.properties).load_table(("ns", "ours")))
        base = ours.metadata
        held = base.model_dump()
        assert copy.deepcopy(base) is base
        loaded = catalog.load_table(("ns", "ours")).metadata.model_dump()
        assert {**held, "properties": {}} == {**loaded, "properties": {}}
        commit(ours)
        assert copies == [] and base.model_dump() == held  # nothing copied, the base left as it was
    theirs, ours = catalog.load_table(("ns", "theirs")), catalog.load_table(("ns", "ours"))
    assert ours.schema() == theirs.schema() and ours.properties["p"] == theirs.properties["p"] == "q"
    assert ours.current_snapshot().summary["k"] == "v"
    assert ours.scan().to_arrow().to_pylist() == theirs.scan().to_arrow().to_pylist()


def test_a_table_loaded_again_takes_its_metadata_files_parse_and_is_the_table_pyiceberg_loads(
    catalog, tmp_path, monkeypatch
):
    from pyiceberg.serializers import FromInputFile

    class Parsing(compat.MetadataParsedOnce, SqlCatalog):
        pass

    parsing = Parsing("compat", **catalog.properties)
    parses = []
    parse = FromInputFile.table_metadata
    monkeypatch.setattr(FromInputFile, "table_metadata", staticmethod(lambda f: parses.append(f) or parse(f)))
    catalog.create_table(("ns", "m"), schema=pa.schema([("x", pa.int64())])).append(pa.table({"x": [1]}))
    with contract("SqlCatalog._convert_orm_to_iceberg and commit_table, Catalog._load_file_io", "pyiceberg"):
        for n in range(2):  # then a commit through `parsing`: the row names the file it wrote, not parsed
            parses.clear()
            tables = [parsing.load_table(("ns", "m")) for _ in range(3)]
            theirs = catalog.load_table(("ns", "m"))
            assert len(parses) == 2 - n, n  # one for the three loads (none after the commit), one for pyiceberg's own
            assert all(t.metadata is tables[0].metadata for t in tables)
            for t in tables:
                assert (t.name(), t.metadata.model_dump(), t.metadata_location, t.io.properties, type(t.io)) == (
                    theirs.name(),
                    theirs.metadata.model_dump(),
                    theirs.metadata_location,
                    theirs.io.properties,
                    type(theirs.io),
                )
            tables[-1].append(pa.table({"x": [2 + n]}))
    assert sorted(parsing.load_table(("ns", "m")).scan().to_arrow()["x"].to_pylist()) == [1, 2, 3]


def test_where_the_sinks_put_a_table_is_where_pyiceberg_puts_one_created_without_a_location(catalog, tmp_path):
    """Public API replaced `_resolve_table_location`; this is that the two still agree."""
    sinks = Sinks(catalog, "ns")
    assert sinks.location("a__log") == catalog.create_table(("ns", "a__log"), schema=LOG_SCHEMA).location()
    catalog.create_namespace("elsewhere", {"location": (tmp_path / "other").as_uri() + "/"})
    sinks = Sinks(catalog, "elsewhere")
    assert sinks.location("b__log") == catalog.create_table(("elsewhere", "b__log"), schema=LOG_SCHEMA).location()


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
        assert compat.spark_schema(arrow) == want


@pytest.mark.spark
def test_persisted_rdds_are_listed_and_released_through_the_jvm_context(spark):
    with contract("SparkContext._jsc.getPersistentRDDs", "pyspark"):
        before = compat.persisted_rdds(spark)
        spark.range(10).localCheckpoint(eager=True)
        made = compat.persisted_rdds(spark) - before
        assert made, "a local checkpoint is a persisted RDD"
        compat.unpersist_rdds(spark, keep=before)
        assert compat.persisted_rdds(spark) == before


@pytest.mark.spark
def test_a_sequence_of_columns_built_once_selects_as_pysparks_select_in_any_session(spark):
    """`compat.column_seq` and `compat.select`: the same rows and names as PySpark's `select`
    of those columns, again and again, from a frame of another session too."""
    from pyspark.sql import functions as F

    with contract("pyspark.sql.classic.column._to_seq, DataFrame._jdf.select", "pyspark"):
        columns = [F.col("id").alias("a"), (F.col("id") * 2).alias("b"), F.lit("x").alias("c")]
        seq = compat.column_seq(columns)
        for session in (spark, spark.newSession()):
            frame = session.range(3)
            got = compat.select(frame, seq)
            assert got.columns == ["a", "b", "c"]
            assert got.collect() == frame.select(*columns).collect() == [(i, 2 * i, "x") for i in range(3)]
            assert got.sparkSession is session


@pytest.mark.spark
def test_frames_reach_the_delta_writer_which_fails_where_another_writer_committed_since_its_base(spark, settings):
    """`compat.delta_commit` hands the changes to infra/delta-writer in the JVM: the rows whose
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
        compat.delta_commit(changes, table, "upsert", "_held", {"k": "v"}, base, add, widen)
    assert sorted(map(tuple, spark.table(table).collect())) == [("a", 1, 1), ("b", 2, 2), ("c", 3, 3)]
    snapshots = f"SELECT count(*) FROM {table}.snapshots"
    now, count = spark.sql(f"SELECT max_by(snapshot_id, committed_at), count(*) FROM {table}.snapshots").first()
    with contract("DataFrame._jdf, SparkSession._jsparkSession, SparkContext._jvm", "pyspark"):
        compat.delta_commit(changes, table, "upsert", "_held", {"k": "v"}, now, add, widen)  # read again, it commits
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
    compat.delta_commit(changes.limit(0), table, "upsert", "_held", {"k": "w"}, now, {}, {})  # nothing: a snapshot
    assert spark.sql(latest).first()[1]["k"] == "w"
    assert len(spark.table(table).collect()) == 2


@pytest.mark.spark
def test_a_python_workers_error_reaches_the_driver_with_its_class_and_message(spark):
    def fail(batches):
        for _ in batches:
            raise SourceError("offsets [0, 5) of t:0 cannot be read: gone")
        yield from ()

    with contract("the text of a Python worker's error (PythonException)", "pyspark"):
        with pytest.raises(Exception) as raised:
            spark.range(1).mapInArrow(fail, "id long").collect()
        assert compat.raised_in_python_worker(raised.value, "connector.core.errors") == (
            "SourceError",
            "offsets [0, 5) of t:0 cannot be read: gone",
        ), str(raised.value)[-2000:]


@pytest.mark.spark
def test_the_jvm_started_with_its_output_redirected_is_the_one_spark_uses(spark, tmp_path):
    """In a process of its own: this one's JVM is running already."""
    assert compat.jvm_started()
    log = tmp_path / "jvm.log"
    script = textwrap.dedent(
        f"""
        from pyspark import SparkConf, SparkContext
        from iceberg import compat

        assert not compat.jvm_started()
        conf = SparkConf(loadDefaults=False).setAppName("compat").setMaster("local[1]")
        with open({str(log)!r}, "ab") as out:
            gateway = compat.start_jvm(conf, out)
        assert compat.jvm_started()
        gateway.jvm.System.out.println("from the jvm")
        gateway.jvm.System.out.flush()
        sc = SparkContext(conf=conf)
        assert sc._gateway is gateway, "SparkContext started a JVM of its own"
        sc.stop()
        """
    )
    root = Path(__file__).resolve().parents[2]
    with contract("java_gateway.launch_gateway + SparkContext._ensure_initialized / _gateway", "pyspark"):
        done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "from the jvm" in log.read_text(), "the JVM's output did not go where it was sent"


@pytest.mark.spark
def test_a_shared_reads_session_compiles_no_code_for_its_queries(spark):
    """`compat.NO_CODEGEN` in the sessions `round_session(small=True)` gives, told by Spark's
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
    """`compat.create_tables` against Spark's own `CREATE TABLE IF NOT EXISTS`: the same
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
        compat.create_tables(spark, settings.catalog.name, made, properties)
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

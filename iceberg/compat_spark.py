"""Every use of what PySpark and py4j do not offer as public API, in one place, as
`iceberg.compat` is pyiceberg's: tests/iceberg/test_compat_spark.py holds a contract test per
internal used here, on the versions `compat.CHECKED_AGAINST` names. The project's Java
helpers (infra/delta-writer, package `cdclake.`) are called from here too."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark import SparkConf
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType


def jvm_started() -> bool:
    """This process has started (or joined) Spark's JVM."""
    from pyspark.core.context import SparkContext

    return SparkContext._gateway is not None


def spark_home() -> str:
    """The Spark installation PySpark starts its JVM from (its `jars` directory the class path's
    start): PySpark's own lookup, `SPARK_HOME` first."""
    from pyspark.find_spark_home import _find_spark_home

    return str(_find_spark_home())  # type: ignore[no-untyped-call]


def stop_jvm(spark: SparkSession, timeout: float) -> int:
    """Stops `spark` and the JVM this process started for it, and waits for the JVM to exit
    (what it does at exit done); its exit code. PySpark stops a session, never its JVM: the
    JVM ends when the pipe to its input closes (`launch_gateway` keeps the process)."""
    from pyspark.core.context import SparkContext

    gateway = SparkContext._gateway
    assert gateway is not None and gateway.proc is not None, "no JVM started by this process"
    spark.stop()
    gateway.shutdown()
    gateway.proc.stdin.close()
    return int(gateway.proc.wait(timeout))


def start_jvm(conf: SparkConf, out: IO[bytes]) -> Any:
    """Starts the driver's JVM with its output to `out`, for the SparkContext made next to
    use. PySpark has no public way to redirect it: its `launch_gateway`, then what
    `SparkContext` does with a gateway it is given (`_ensure_initialized`). The gateway."""
    from pyspark.core.context import SparkContext
    from pyspark.java_gateway import launch_gateway

    gateway = launch_gateway(conf, popen_kwargs={"stdout": out, "stderr": out})  # type: ignore[no-untyped-call]
    SparkContext._ensure_initialized(gateway=gateway)
    return gateway


def spark_schema(schema: pa.Schema) -> StructType:
    """Spark's schema of Arrow's `schema` (what `mapInArrow` gives back): PySpark converts
    one only in a module its API reference leaves out."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def persisted_rdds(spark: SparkSession) -> set[int]:
    """The ids of the RDDs persisted in the session's context (local checkpoints among them):
    PySpark lists none, the JVM's context does (`getPersistentRDDs`, through `_jsc`)."""
    return set(spark.sparkContext._jsc.getPersistentRDDs().keySet())


def unpersist_rdds(spark: SparkSession, keep: set[int]) -> None:
    """Releases the persisted RDDs not in `keep` (without waiting for their blocks to go)."""
    for rdd_id, rdd in spark.sparkContext._jsc.getPersistentRDDs().items():
        if rdd_id not in keep:
            rdd.unpersist(False)


def _helper(spark: SparkSession, name: str) -> Any:
    """The class `cdclake.<name>` (infra/delta-writer) in the driver's JVM, looked up by its full
    name: py4j's `jvm.cdclake.X` looks `cdclake` up as a class first, in every jar of the class
    path and under each package PySpark imports (0.5 ms against 0.1 ms)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    return getattr(jvm, f"cdclake.{name}")


def delta_commit(
    changes: DataFrame,
    table: str,
    keep: str,
    held: str,
    properties: Mapping[str, str],
    base: int,
    add: Mapping[str, str],
    widen: Mapping[str, str],
) -> None:
    """`cdclake.DeltaWriter.commit` (infra/delta-writer) in the driver's JVM, given the frame's
    Java dataset and session (PySpark's py4j handles `_jdf`, `_jsparkSession`, `_jvm`); the
    column changes as lists (name, type, ...): py4j makes a dict a map without order."""
    spark = changes.sparkSession
    pairs = [[x for item in m.items() for x in item] for m in (add, widen)]
    writer = _helper(spark, "DeltaWriter")
    writer.commit(spark._jsparkSession, table, changes._jdf, keep, held, dict(properties), base, *pairs)


def create_tables(spark: SparkSession, catalog: str, columns: Mapping[str, str], properties: Mapping[str, str]) -> None:
    """`cdclake.Tables.create` (infra/delta-writer) in the driver's JVM: each table of
    `columns` (`namespace.table`: its columns as DDL) that `catalog` lacks, created with
    `properties`, as `CREATE TABLE IF NOT EXISTS` would (PySpark's py4j handles)."""
    tables = [x for item in columns.items() for x in item]
    _helper(spark, "Tables").create(spark._jsparkSession, catalog, tables, dict(properties))


def in_parts(frame: DataFrame, column: str) -> Any:
    """`cdclake.Parts.of` (infra/delta-writer): `frame`'s rows collected into the driver's JVM
    (one job) in parts by the int `column`, each read back by `part` as a local relation of its
    own rows (Spark's analysis walks every row a local relation holds). Through PySpark's py4j
    handles (`_jdf`, `_jvm`); the rows never reach Python."""
    return _helper(frame.sparkSession, "Parts").of(frame._jdf, column)


def part(parts: Any, session: SparkSession, index: int) -> DataFrame:
    """Part `index` of `in_parts`'s rows (without its column) as a frame of `session`."""
    from pyspark.sql import DataFrame as Frame

    return Frame(parts.part(session._jsparkSession, index), session)


def jvm_reads(
    spark: SparkSession, logs: list[str], prefixes: list[str], ranges: list[list[Any]], columns: list[str]
) -> tuple[DataFrame, Callable[[list[str | None], list[str]], DataFrame | None]]:
    """`cdclake.Reads` (infra/delta-writer): the logs' rows in their ranges, read in the driver's
    JVM as one frame, and a function of their state or tombstone tables (in the same order) and
    columns giving those tables' rows for the logs' keys, one frame (through py4j handles)."""
    from pyspark.sql import DataFrame as Frame

    reads = _helper(spark, "Reads").log(spark._jsparkSession, logs, prefixes, ranges, columns)

    def held(tables: list[str | None], columns: list[str]) -> DataFrame | None:
        rows = reads.held(spark._jsparkSession, tables, columns)
        return None if rows is None else Frame(rows, spark)

    return Frame(reads.events(), spark), held


def column_seq(columns: Sequence[Column]) -> Any:
    """`columns` as the Scala sequence the JVM's `Dataset.select` takes, for `select` to give
    it again and again: PySpark's `select` builds one on every call (`_to_seq`: a call to the
    JVM per column, through py4j's list conversion)."""
    from pyspark import SparkContext
    from pyspark.sql.classic.column import _to_seq

    return _to_seq(SparkContext.getOrCreate(), [c._jc for c in columns])


def select(frame: DataFrame, columns: Any) -> DataFrame:
    """`frame.select(*c)` for `columns = column_seq(c)`, in one call to the JVM (`_jdf`)."""
    from pyspark.sql import DataFrame as Frame

    return Frame(frame._jdf.select(columns), frame.sparkSession)


# -- settings

# A session's queries compiled to no code: no whole-stage code generation (a public setting),
# and every expression, projection and ordering interpreted (`factoryMode`, internal to Spark).
NO_CODEGEN = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


def raised_in_python_worker(e: BaseException, module: str) -> tuple[str, str] | None:
    """(class name, message) of an exception of `module` that a Spark Python worker raised,
    out of the Spark error that carries it on the driver; else None. It arrives as text only
    (the worker's traceback, ending `<module>.<Class>: <message>`)."""
    m = re.search(re.escape(module) + r"\.(\w+): ([^\n]*)", str(e))
    return (m.group(1), m.group(2)) if m else None

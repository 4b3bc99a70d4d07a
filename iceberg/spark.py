"""Spark set-up in one place: a builder configured for the project's catalog."""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from connector.core.errors import SetupError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from connector.core.config import Settings

DEFAULT_JARS_DIR = Path(__file__).resolve().parents[1] / ".cache" / "jars"
CLASS_ARCHIVE = "cdclake-classes.jsa"  # in the jars' directory: infra/class_archive.py writes it
# G1's concurrent work competes with the tasks for the few cores a local driver has:
# the parallel collector measured 15-35% faster on the compaction's sort and shuffle.
JAVA_OPTIONS = "-XX:+UseParallelGC"
# A process that runs one command and exits spends most of its driver JVM's time warming up:
# each busy method compiled by C1 with profiling, then again by C2, whose threads take the few
# cores from the work. Compiled by C1 alone, a command finishes sooner (a `compact` of 100,000
# events 13 - 15 s against 18 - 20 s, docs/performance.md); a job that stays up (`run --every`)
# keeps C2, whose code is faster once warm.
SHORT_LIVED_OPTIONS = "-XX:TieredStopAtLevel=1"
_short_lived = [False]


def short_lived(yes: bool = True) -> None:
    """Whether this process runs one command and exits (the CLI says so before any session
    starts): its driver JVM then compiles with C1 alone (`SHORT_LIVED_OPTIONS`)."""
    _short_lived[0] = yes


def jars_dir(settings: Settings) -> Path:
    return Path(settings.spark.jars_dir) if settings.spark.jars_dir else DEFAULT_JARS_DIR


def spark_jars(settings: Settings) -> list[str]:
    directory = jars_dir(settings)
    jars = sorted(str(p) for p in directory.glob("*.jar"))
    for needed in ("iceberg-spark-runtime", "cdclake-delta-writer"):
        if not any(needed in Path(j).name for j in jars):
            raise SetupError(
                f"no {needed} jar in {directory}: run `bash infra/fetch-jars.sh` (Maven resolves "
                "infra/pom.xml into .cache/jars, javac builds infra/delta-writer) or set spark.jars_dir"
            )
    return jars


def file_io(settings: Settings) -> dict[str, str]:
    """The catalog's FileIO properties for Iceberg in Spark: the configured ones, with
    `S3FileIO` (iceberg-aws-bundle) for a warehouse on S3 unless `io-impl` names another, and
    `ADLSFileIO` with its credentials for one on Azure (`iceberg.azure`), and for a local one
    `cdclake.LocalFileIO` (infra/delta-writer: Java's file API, not Hadoop's process a file)."""
    from iceberg.catalog import storage_properties

    props = storage_properties(settings, spark=True)
    if settings.warehouse.startswith(("s3://", "s3a://")):
        props.setdefault("io-impl", "org.apache.iceberg.aws.s3.S3FileIO")
    elif settings.warehouse.startswith("file:") or "://" not in settings.warehouse:
        props.setdefault("io-impl", "cdclake.LocalFileIO")
    return props


def starts_local_driver(settings: Settings) -> bool:
    """Whether this process starts the driver's JVM itself, for a local master (not under
    spark-submit, whose JVM runs already, nor for a cluster's executors)."""
    master = settings.spark.master or "local"  # PySpark's default
    return "PYSPARK_GATEWAY_PORT" not in os.environ and re.fullmatch(r"local(\[.*\])?", master) is not None


def driver_conf(settings: Settings) -> dict[str, str]:
    """The jars and the driver JVM's options as Spark configuration. A local driver this
    process starts has the jars on its class path, after Spark's own so that Spark's classes
    win where a bundle carries another version (as under `spark.jars`), and maps the class
    archive beside them if there is one (infra/class_archive.py: the session and its first
    queries start in about half the time, docs/performance.md); no copy of the jars is made
    for its executor (150 MB a start under `spark.jars`, left behind by a killed process).
    Otherwise the jars go as `spark.jars`, which Spark ships to the executors. The
    configuration's own `spark.driver.extraClassPath` or `spark.jars` comes after the jars; its own
    `spark.driver.extraJavaOptions` replace `JAVA_OPTIONS` (and, in a short-lived process,
    `SHORT_LIVED_OPTIONS`), with the archive unless they name one (`-Xshare`,
    `SharedArchiveFile`)."""
    from iceberg import compat_spark

    jars, own = spark_jars(settings), settings.spark.conf
    default = f"{JAVA_OPTIONS} {SHORT_LIVED_OPTIONS}" if _short_lived[0] else JAVA_OPTIONS
    options = own.get("spark.driver.extraJavaOptions", default)
    if not starts_local_driver(settings):
        shipped = ",".join([*jars, *filter(None, [own.get("spark.jars")])])
        return {"spark.jars": shipped, "spark.driver.extraJavaOptions": options}
    path = [os.path.join(compat_spark.spark_home(), "jars", "*"), *jars]
    archive = jars_dir(settings) / CLASS_ARCHIVE
    if archive.is_file() and not re.search(r"-Xshare|SharedArchiveFile|ArchiveClassesAtExit", options):
        options = f"{options} -XX:SharedArchiveFile={shlex.quote(str(archive))}"
    classes = os.pathsep.join([*path, *filter(None, [own.get("spark.driver.extraClassPath")])])
    return {"spark.driver.extraClassPath": classes, "spark.driver.extraJavaOptions": options}


def spark_conf(settings: Settings) -> dict[str, str]:
    """Jars, the Iceberg extensions and the catalog, as Spark configuration."""
    from iceberg.catalog import spark_catalog_properties

    name = settings.catalog.name
    prefix = f"spark.sql.catalog.{name}"
    conf = {
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        **{f"{prefix}.{k}": v for k, v in spark_catalog_properties(settings).items()},
        f"{prefix}.warehouse": settings.warehouse,
        # pyiceberg commits to the same tables: always read the current metadata.
        f"{prefix}.cache-enabled": "false",
        "spark.sql.defaultCatalog": name,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(settings.spark.shuffle_partitions),
        "spark.driver.memory": settings.spark.driver_memory,
        "spark.ui.enabled": "false",
        # concurrent compaction rounds share the cores fairly (a pool each: `round_session`)
        "spark.scheduler.mode": "FAIR",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # PySpark's call-site capture on every Column and DataFrame call (for the query context
        # of an error): 5 - 6 round trips to the JVM and a walk of the Python stack each time
        # (building a log's candidates frame: 25 ms with it, 9 ms without)
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        # Spark's default plus the options that carry Kafka, Event Hubs and Azure storage credentials, so
        # they never show in plans, the UI or the event log.
        "spark.redaction.regex": (
            r"(?i)secret|password|token|credential|access[.]?key|account[.]key|sasl[.]jaas[.]config|connection_string"
        ),
        **{f"{prefix}.{k}": v for k, v in file_io(settings).items()},
        **settings.spark.conf,
        **driver_conf(settings),  # with the configuration's own class path and JVM options
    }
    return conf


def configure_spark(builder: SparkSession.Builder, settings: Settings) -> SparkSession.Builder:
    """Takes a builder, returns it with jars, the Iceberg extensions and the catalog set. The
    driver's class path, jars and JVM options (`driver_conf`) only while no JVM runs: a running
    driver keeps those it started with, and a session of it given others (by a later command
    in the same process, short-lived where the first was not) would hand them to the sessions
    made from it, which cannot take them."""
    from iceberg import compat_spark

    builder = builder.appName("cdclake")
    if settings.spark.master:  # else the one spark-submit was given, or local[*]
        builder = builder.master(settings.spark.master)
    fixed = driver_conf(settings).keys() if compat_spark.jvm_started() else set()
    for k, v in spark_conf(settings).items():
        if k not in fixed:
            builder = builder.config(k, v)
    return builder


def spark_log(settings: Settings) -> Path:
    return settings.root / "logs" / "spark.log"


def _launch_jvm_quietly(settings: Settings) -> None:
    """Starts the driver's JVM with its output (Spark's and the JVM's start-up lines, the Kafka
    client's retries, the Python workers' stderr) appended to `<work_dir>/logs/spark.log`
    instead of the console, unless logging is verbose (`-v`). What fails reaches Python as an
    exception either way."""
    from pyspark import SparkConf

    from iceberg import compat_spark

    if compat_spark.jvm_started() or logging.getLogger().isEnabledFor(logging.INFO):
        return
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # under spark-submit: its JVM, its output
        return
    path = spark_log(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    conf = SparkConf(loadDefaults=False).setAppName("cdclake")
    if settings.spark.master:
        conf.setMaster(settings.spark.master)
    conf.setAll(list(spark_conf(settings).items()))
    with open(path, "ab") as out:  # the JVM keeps its own descriptor
        compat_spark.start_jvm(conf, out)


def get_spark(settings: Settings) -> SparkSession:
    """The process's Spark session (created once; later calls return the same one)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    _launch_jvm_quietly(settings)
    spark = configure_spark(SparkSession.builder, settings).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    _ship_code(spark, settings)
    return spark


_SHIPPED: set[int] = set()


def _ship_code(spark: SparkSession, settings: Settings) -> None:
    """On a cluster, the project's packages go to the executors (`addPyFile`): their Python
    workers decode and transform with them. A local master shares the driver's files."""
    sc = spark.sparkContext
    if (sc.master or "local").startswith("local") or id(sc) in _SHIPPED:
        return
    import zipfile

    root = Path(__file__).resolve().parents[1]
    target = settings.root / "cdclake-py.zip"
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for package in ("connector", "iceberg", "quotas"):
            for f in sorted((root / package).rglob("*.py")):
                z.write(f, f.relative_to(root))
    sc.addPyFile(str(target))
    _SHIPPED.add(id(sc))


_FREE_SESSIONS: dict[bool, list[SparkSession]] = {False: [], True: []}  # by `small`
_SESSIONS_LOCK = threading.Lock()
_HELD: dict[int, dict[str, str]] = {}  # per kept session (by id): the settings it holds


@contextmanager
def round_session(
    spark: SparkSession, own: bool, conf: dict[str, str] | None = None, small: bool = False
) -> Iterator[SparkSession]:
    """The session a compaction round runs in: with `own`, one no other running round uses
    (its temp views and snapshot properties are its own; it takes the SQL settings of
    `spark` set since, or `conf`, those settings as the caller read them: each read is a
    call to the JVM per setting), with its jobs in a fair-scheduler pool of the thread's
    name. Sessions are kept for the next rounds (each holds its catalog's connections).
    With `small` (a shared read of few events, `shared.COMPILED_EVENTS`, and the rounds a
    shared read read, always in a session of their own), the session compiles no code for its
    queries (`compat_spark.NO_CODEGEN`): their rows are few, and compiling each query's code
    cost more than it saved (docs/performance.md)."""
    from iceberg import compat_spark

    if not own and not small:
        yield spark
        return
    with _SESSIONS_LOCK:
        mine = [x for x in _FREE_SESSIONS[small] if x.sparkContext is spark.sparkContext]
        session = mine[0] if mine else None
        if session is not None:
            _FREE_SESSIONS[small].remove(session)
    if session is None:
        session = spark.newSession()
        _HELD[id(session)] = session.conf.getAll  # not `SET`, whose values of secret keys are redacted
    held = _HELD[id(session)]
    wanted = (spark.conf.getAll if conf is None else conf) | (compat_spark.NO_CODEGEN if small else {})
    for k, v in wanted.items():
        if held.get(k) != v:
            session.conf.set(k, v)
            held[k] = v
    sc = spark.sparkContext
    sc.setLocalProperty("spark.scheduler.pool", threading.current_thread().name)
    try:
        yield session
    finally:
        sc.setLocalProperty("spark.scheduler.pool", None)  # type: ignore[arg-type]
        with _SESSIONS_LOCK:
            _FREE_SESSIONS[small].append(session)

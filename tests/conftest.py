"""Shared fixtures: the Debezium samples, one Spark session per run, isolated namespaces."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from connector.core.config import Settings, load_settings

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "debezium"  # real samples, see SOURCES.md there
_ns = itertools.count()


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return FIXTURES


def kcat_lines(topic: str, values: list, keys: list, partition: int = 0, ts0: int = 1_700_000_000_000) -> list[str]:
    """kcat -J records for raw values (str or None) with JSON-able keys."""
    return [
        json.dumps(
            {
                "topic": topic,
                "partition": partition,
                "offset": i,
                "ts": ts0 + i,
                "key": None if k is None else json.dumps(k),
                "payload": v,
            }
        )
        for i, (k, v) in enumerate(zip(keys, values))
    ]


@pytest.fixture(scope="session")
def work_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cdclake")


@pytest.fixture
def settings(work_root: Path) -> Settings:
    """Settings on the run's shared catalog, with a namespace of this test's own."""
    return load_settings(work_dir=work_root, catalog={"namespace": f"t{next(_ns)}"})


@pytest.fixture(scope="session")
def spark(work_root: Path):
    import os

    from iceberg.spark import get_spark

    # Python workers import test helpers (the Event Hubs fake reader) too
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    events = work_root / "spark-events"  # Spark's event log, read by the secret-redaction test
    events.mkdir(exist_ok=True)
    conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(), "spark.eventLog.compress": "false"}
    session = get_spark(
        load_settings(work_dir=work_root, spark={"master": "local[2]", "shuffle_partitions": 2, "conf": conf})
    )
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _one_spark_session(request):
    """Tests marked `spark` (or `kafka`: ingest runs on Spark) share the run's session, created
    once with the test settings, whichever of them runs first (a long-lived driver JVM, as the
    suite's is: `iceberg.spark.short_lived`)."""
    from iceberg.spark import short_lived

    if request.node.get_closest_marker("spark") or request.node.get_closest_marker("kafka"):
        request.getfixturevalue("spark")
    yield
    short_lived(False)  # a command this test invoked in the run's process said it was short-lived


SASL_PASSWORD = "Endpoint=sb://cdclake-test.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=s3cr3t="


def infra(name: str):
    """A script of `infra/` as a module (they are scripts, not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "infra" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    """One real KRaft broker for the run (PLAINTEXT and SASL_PLAINTEXT listeners on 127.0.0.1)."""
    broker = infra("kafka_broker").KafkaBroker(tmp_path_factory.mktemp("kafka"), sasl_password=SASL_PASSWORD).start()
    yield broker
    broker.stop()


PG_PASSWORD = "pg-s3cr3t-for-tests"


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server (Debian's package, infra/postgres.py) on a free 127.0.0.1 port."""
    import shutil
    import tempfile

    module = infra("postgres")
    try:
        module.binaries()
    except FileNotFoundError as e:
        pytest.skip(f"{e} (infra/setup.sh installs it where it runs as root)")
    where = tempfile.mkdtemp(prefix="cdclake-pg-")  # outside pytest's private tree: the server runs as `postgres`
    server = module.PostgresServer(where, password=PG_PASSWORD).start()
    yield server
    server.stop()
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """moto's S3 server (infra/s3_server.py) on a free 127.0.0.1 port, with a bucket `lake`."""
    server = infra("s3_server").S3Server(tmp_path_factory.mktemp("s3")).start(("lake",))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def rest_catalog(tmp_path_factory):
    """Iceberg's REST catalog server (infra/rest_catalog.py, Maven jars) on a free 127.0.0.1
    port, a SQLite catalog and a local warehouse behind it."""
    server = infra("rest_catalog").RestCatalogServer(tmp_path_factory.mktemp("rest")).start()
    yield server
    server.stop()


AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="  # public dev key
)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory):
    """Azurite's blob service on a free 127.0.0.1 port; yields its connection string."""
    import socket
    import subprocess
    import time

    exe = Path(__file__).resolve().parents[1] / ".cache" / "node" / "node_modules" / ".bin" / "azurite-blob"
    if not exe.exists():
        pytest.fail(f"{exe} missing: run bash infra/setup.sh")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            str(exe),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--location",
            str(tmp_path_factory.mktemp("azurite")),
            "--skipApiVersionCheck",
            "--loose",
            "--disableTelemetry",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("Azurite did not start")
    yield (
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={AZURITE_KEY};"
        f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
    )
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A Spark standalone cluster (infra/spark_cluster.py): a master and two 1-core workers
    on 127.0.0.1."""
    cluster = infra("spark_cluster").SparkCluster(tmp_path_factory.mktemp("cluster")).start(workers=2)
    yield cluster
    cluster.stop()

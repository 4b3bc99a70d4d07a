"""Shared fixtures: the Debezium samples, one Spark session per run, isolated namespaces."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from connector.config import Settings, load_settings

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "debezium"
_ns = itertools.count()


@pytest.fixture(scope="session")
def fixtures() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"Debezium samples not found at {FIXTURES} (shared/ must sit beside the repository)")
    return FIXTURES


def kcat_lines(topic: str, values: list, keys: list, partition: int = 0, ts0: int = 1_700_000_000_000) -> list[str]:
    """kcat -J records for raw values (str or None) with JSON-able keys."""
    return [json.dumps({"topic": topic, "partition": partition, "offset": i, "ts": ts0 + i,
                        "key": None if k is None else json.dumps(k), "payload": v})
            for i, (k, v) in enumerate(zip(keys, values))]


@pytest.fixture(scope="session")
def work_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cdclake")


@pytest.fixture
def settings(work_root: Path) -> Settings:
    """Settings on the run's shared catalog, with a namespace of this test's own."""
    return load_settings(work_dir=work_root, catalog={"namespace": f"t{next(_ns)}"})


@pytest.fixture(scope="session")
def spark(work_root: Path):
    from iceberg.spark import get_spark

    session = get_spark(load_settings(work_dir=work_root, spark={"shuffle_partitions": 2}))
    yield session
    session.stop()


SASL_PASSWORD = "Endpoint=sb://cdclake-test.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=s3cr3t="


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    """One real KRaft broker for the run (PLAINTEXT and SASL_PLAINTEXT listeners on 127.0.0.1)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "infra" / "kafka_broker.py"
    spec = importlib.util.spec_from_file_location("kafka_broker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    broker = module.KafkaBroker(tmp_path_factory.mktemp("kafka"), sasl_password=SASL_PASSWORD).start()
    yield broker
    broker.stop()

"""A stream produced to the real broker by a separate producer process lands in the
compacted tables exactly once across a broker restart and a connector kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from connector.app import run_compaction
from connector.core.records import SourceRecord
from connector.debezium import Decoder
from iceberg.catalog import load_catalog
from tests.connector.test_kafka_source import kafka_settings, new_topic
from tests.iceberg.helpers import names, offsets_by_key
from tests.model import expected_tables

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


def log_rows(s, table):
    t = load_catalog(s).load_table(names(s, table).log)
    return t.scan().to_arrow().to_pylist()


def safe_log_rows(s, table):
    try:
        return log_rows(s, table)
    except Exception:  # noqa: BLE001 - the table does not exist yet
        return []


def assert_tables_match_the_model_of(s, table: str, rows: list[dict]) -> None:
    """The state and tombstones equal the model over the log's rows (an independent computation)."""
    decoder = Decoder()
    events = [
        decoder.decode(
            SourceRecord(
                r["topic"],
                r["partition"],
                r["offset"],
                r["sequence_number"],
                r["enqueued_time"],
                r["key"].encode(),
                r["value"],
            )
        )
        for r in rows
    ]
    state, tombs = expected_tables(events, "source")
    assert offsets_by_key(s, names(s, table).state) == state
    assert offsets_by_key(s, names(s, table).tombstones) == tombs


# What a child process takes from the test's environment: the system's and the runtimes'
# necessities, never a CDCLAKE_* variable (an unknown one is a configuration error)
PASSED_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "JAVA_HOME",
    "SPARK_HOME",
    "SPARK_LOCAL_IP",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "PYTHONPATH",
    "VIRTUAL_ENV",
)


def connector_env(s, topic: str, batch_size: int, unavailable_timeout: int, **more: str) -> dict[str, str]:
    """The environment of `cdclake run` against the settings' broker and namespace: the
    necessities of `PASSED_ENV` and the settings given here, nothing else. `topic`: the one
    topic, or with `CDCLAKE_SOURCE__TOPICS_PATTERN` in `more`, none."""
    topics = {} if "CDCLAKE_SOURCE__TOPICS_PATTERN" in more else {"CDCLAKE_SOURCE__TOPICS": json.dumps([topic])}
    return {
        **{k: os.environ[k] for k in PASSED_ENV if k in os.environ},
        "PYTHONUNBUFFERED": "1",  # its log lines as they happen
        "CDCLAKE_WORK_DIR": str(s.work_dir),
        "CDCLAKE_CATALOG__NAMESPACE": s.catalog.namespace,
        "CDCLAKE_SOURCE__TYPE": "kafka",
        "CDCLAKE_SOURCE__BOOTSTRAP_SERVERS": s.source.bootstrap_servers,
        **topics,
        "CDCLAKE_SOURCE__BATCH_SIZE": str(batch_size),
        "CDCLAKE_SOURCE__UNAVAILABLE_TIMEOUT_SECONDS": str(unavailable_timeout),
        "CDCLAKE_SPARK__SHUFFLE_PARTITIONS": "2",
        **more,
    }


def connector(s, topic: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "connector.cli", "run", "--every", "1"],
        env=connector_env(s, topic, batch_size=50, unavailable_timeout=60),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def test_exactly_once_across_broker_restart_and_connector_kill(spark, settings, kafka, tmp_path):
    topic = new_topic(kafka, 2)
    table = topic.rsplit(".", 1)[1]
    s = kafka_settings(settings, kafka, topic)
    delivered = tmp_path / "delivered.jsonl"
    producer = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "kafka_producer.py"),
            kafka.bootstrap,
            topic,
            "400",
            str(delivered),
            str(tmp_path / "go"),
        ],
        cwd=ROOT,
    )
    run = connector(s, topic)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(safe_log_rows(s, table)) < 20:
        time.sleep(0.5)
    assert producer.poll() is None, "the producer waits for the go file"
    os.killpg(run.pid, signal.SIGKILL)  # the connector dies mid-stream
    run.wait()
    kafka.stop()  # and the broker goes away for a moment
    time.sleep(2)
    kafka.start()
    (tmp_path / "go").touch()  # the second half is produced while the connector restarts
    run = connector(s, topic)
    assert producer.wait(180) == 0
    sent = [json.loads(line) for line in delivered.read_text().splitlines()]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and len(log_rows(s, table)) < len(sent):
        time.sleep(2)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()

    rows = log_rows(s, table)
    got = sorted((r["partition"], r["sequence_number"]) for r in rows)
    assert got == sorted((e["partition"], e["offset"]) for e in sent)  # nothing lost, nothing twice
    run_compaction(s, [table], force=True)
    assert_tables_match_the_model_of(s, table, rows)

"""Chaos on the loopback: `cdclake run --every 1` processes on a Kafka stream, killed with
SIGKILL at random moments (seeded: in ingest, compaction, maintenance or position mirroring,
wherever each lands), two of them started at once on the same input, and the broker stopped
and started in the middle. One clean run afterwards must leave exactly what the model of the
stream says: every produced event once in the log, and the state and tombstones of the
newest change per key.

`CDCLAKE_CHAOS_KILLS` (default 4) sets how many processes are killed; e.g. 40 for a long run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from connector.app import run_compaction, run_ingest
from tests.connector.test_kafka_source import kafka_settings, new_topic
from tests.test_kafka_end_to_end import assert_tables_match_the_model_of, connector_env, log_rows

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
KILLS = int(os.environ.get("CDCLAKE_CHAOS_KILLS", "4"))


def _run(s, topic: str, log: Path) -> subprocess.Popen:
    env = connector_env(
        s,
        topic,
        batch_size=100,
        unavailable_timeout=30,
        CDCLAKE_SOURCE__GROUP_ID=s.source.group_id,
        # maintenance after every round, so kills land in it too
        CDCLAKE_MAINTENANCE__SNAPSHOT_RETENTION_HOURS="0",
        CDCLAKE_MAINTENANCE__REWRITE_FILES="2",
    )
    out = open(log, "wb")
    return subprocess.Popen(
        [sys.executable, "-m", "connector.cli", "-v", "run", "--every", "1", "--force"],
        env=env,
        stdout=out,
        stderr=out,
        start_new_session=True,
        cwd=ROOT,
    )


def _last_step(log: Path) -> str:
    """What a process was doing when it was killed (the module of its last log line), or
    the error it stopped with."""
    text = log.read_text(errors="replace").splitlines()
    errors = [line for line in text if line.startswith("error:")]
    lines = [line for line in text if " INFO " in line or " WARNING " in line]
    return errors[-1][:90] if errors else lines[-1].split()[3].rstrip(":") if lines else "starting"


def test_kills_a_second_writer_and_a_broker_restart_end_as_one_clean_run(spark, settings, kafka, tmp_path):
    rng = random.Random(20261124)
    topic = new_topic(kafka, 2)
    table = topic.rsplit(".", 1)[1]
    s = kafka_settings(settings, kafka, topic, batch_size=1000)
    delivered = tmp_path / "delivered.jsonl"
    producer = [sys.executable, str(ROOT / "tests" / "kafka_producer.py"), kafka.bootstrap, topic, "600"]
    subprocess.run([*producer, str(delivered)], cwd=ROOT, check=True, timeout=120)
    sent = [json.loads(line) for line in delivered.read_text().splitlines()]

    where = []
    for i in range(KILLS):
        logs = [tmp_path / f"run-{i}-{j}.log" for j in range(2 if i == 0 else 1)]  # two writers at once first
        runs = [_run(s, topic, log) for log in logs]
        if i == KILLS // 2:  # the broker goes away while they run
            time.sleep(rng.uniform(8, 14))
            kafka.stop()
            time.sleep(2)
            kafka.start()
        time.sleep(rng.uniform(10, 30) if i else 25)
        for run, log in zip(runs, logs):
            killed = run.poll() is None
            if killed:
                os.killpg(run.pid, signal.SIGKILL)
            run.wait()
            where.append(("killed in " if killed else "stopped: ") + _last_step(log))
    print("\n".join(where))

    run_ingest(s)  # one clean run
    run_compaction(s, [table], force=True)
    rows = log_rows(s, table)
    assert sorted((r["partition"], r["sequence_number"]) for r in rows) == sorted(
        (e["partition"], e["offset"]) for e in sent
    ), "every produced event once in the log"
    assert_tables_match_the_model_of(s, table, rows)

"""Chaos on the loopback: `cdclake run --every 1` processes on the Kafka streams of three
tables (`topics_pattern`, their rounds at once), killed with SIGKILL at random moments of
their work, two of them started at once on the same input, and the broker stopped and
started in the middle. One clean run afterwards must leave exactly what the model of the
streams says: every produced event once in each table's log, and each table's state and
tombstones of the newest change per key.

Each round produces new events, starts a process (two in the first round) and kills it a
random moment (seeded) after a random line of its work: the k-th step of ingest or
compaction its log (`-v`) reports. Where each process was when it was killed is read from
its log by the phase its lines say (`PHASES`): the chaos must have landed, at least half of
the processes killed in a step of ingest or compaction (not starting up, not idle between
rounds or retrying, not stopped on their own), and the broker must have gone away while a
process was alive and ingesting. The processes get only the environment they need
(`connector_env`), never the test's own CDCLAKE_* variables.

`CHAOS_KILLS` (default 4; read by the test, never passed on) sets how many rounds of processes
are killed; e.g. 40 for a long run."""

from __future__ import annotations

import functools
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from connector.app import run_compaction, run_ingest
from iceberg.catalog import load_catalog
from tests.connector.test_kafka_source import kafka_settings, new_topic
from tests.kafka_producer import change
from tests.test_kafka_end_to_end import assert_tables_match_the_model_of, connector_env, log_rows

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
KILLS = int(os.environ.get("CHAOS_KILLS", "4"))
EVENTS_PER_ROUND = 150  # over the tables
TABLES = 3
WORK = ("ingest", "compaction")  # the phases a kill must land in
# The phase a line of `cdclake -v run` starts, by its logger (`%(levelname)s %(name)s:`) or the
# console's summary of a step; the first pattern that matches wins, other lines change nothing.
PHASES = [
    # the end of a compaction pass: what follows is the wait before the next round
    (re.compile(r" INFO connector\.app: compaction pass over "), "idle"),
    # the consumer's notices (`kafka <broker>: ...`) change nothing: many come while the broker is away
    (
        re.compile(r" (INFO|WARNING) (connector\.(pipeline|sinks|sources\.\w+)|iceberg\.log_writer): (?!kafka )"),
        "ingest",
    ),
    (re.compile(r"^ingesting: "), "ingest"),
    (re.compile(r"^\s*ingested [\d,]+ records"), "compaction"),  # ingest returned, compaction begins
    (re.compile(r" (INFO|WARNING) iceberg\.(compaction\.\w+|maintenance): "), "compaction"),
    (re.compile(r"^warning: round failed"), "retrying"),  # the backoff before the next round
]


def _run(s, log: Path) -> subprocess.Popen:
    env = connector_env(
        s,
        "",
        batch_size=100,
        unavailable_timeout=30,
        CDCLAKE_SOURCE__GROUP_ID=s.source.group_id,
        CDCLAKE_SOURCE__TOPICS_PATTERN=s.source.topics_pattern,
        CDCLAKE_COMPACTION__PARALLEL_TABLES=str(TABLES),
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


def _produce(bootstrap: str, topic: str, rng: random.Random, first: int, n: int) -> list[tuple[int, int]]:
    """Events `first` to `first + n - 1` of the stream (`kafka_producer.change`, a tombstone
    after each delete), produced here; returns where each landed: (partition, offset)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    delivered: list[tuple[int, int]] = []
    failed: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            delivered.append((msg.partition(), msg.offset()))

    table = topic.rsplit(".", 1)[1]
    for i in range(first, first + n):
        key, value, partition, tombstone = change(table, i, rng)
        p.produce(topic, key=key, value=value, partition=partition, on_delivery=on_delivery)
        if tombstone:
            p.produce(topic, key=key, value=None, partition=partition, on_delivery=on_delivery)
        p.poll(0)
    assert p.flush(60) == 0 and not failed, f"every event delivered: {failed}"
    return delivered


def _steps(log: Path) -> list[tuple[str, str]]:
    """(phase, line) for each line of the log that starts a phase (`PHASES`), in order."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        phase = next((phase for pattern, phase in PHASES if pattern.search(line)), None)
        if phase is not None:
            out.append((phase, line.strip()))
    return out


def _worked(logs: list[Path]) -> int:
    """How many steps of ingest or compaction the logs report."""
    return sum(phase in WORK for log in logs for phase, _ in _steps(log))


def _worked_to(logs: list[Path], goal: int) -> bool:
    return _worked(logs) >= goal


def _where(log: Path, alive: bool) -> tuple[str, str]:
    """The phase a process was in (`stopped` if it had exited) and the line that says so."""
    if not alive:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if re.match(r"error:|\w*(Error|Exception)\b", line)]
        return "stopped", (errors or lines or ["no output"])[-1]
    steps = _steps(log)
    return steps[-1] if steps else ("starting", "no step of work yet")


def _reading(runs: list[subprocess.Popen], logs: list[Path]) -> list[str]:
    """The logs of the processes alive that have started ingesting."""
    return [
        log.name
        for run, log in zip(runs, logs)
        if run.poll() is None and any(phase == "ingest" for phase, _ in _steps(log))
    ]


def _wait(runs: list[subprocess.Popen], until: Callable[[], object], timeout: float = 120.0) -> None:
    """Until `until()`, every run has exited, or `timeout` seconds passed."""
    deadline = time.monotonic() + timeout
    while not until() and any(run.poll() is None for run in runs) and time.monotonic() < deadline:
        time.sleep(0.1)


def test_kills_a_second_writer_and_a_broker_restart_end_as_one_clean_run(spark, settings, kafka, tmp_path):
    rng = random.Random(20261124)
    prefix = f"pg.chaos{rng.randrange(1 << 30):x}"
    topics = [new_topic(kafka, 2, f"{prefix}.t{i}") for i in range(TABLES)]
    s = kafka_settings(
        settings, kafka, "", topics=None, topics_pattern=rf"{re.escape(prefix)}\.t\d", batch_size=1000, group_id=prefix
    )
    load_catalog(s)  # the catalog's own tables exist before two processes open it at once
    sent: dict[str, list[tuple[int, int]]] = {t: [] for t in topics}
    sites: list[str] = []  # per process: where it was killed, or that it had stopped
    mid_work = 0
    reading_at_outage: list[str] = []
    each = EVENTS_PER_ROUND // TABLES
    for i in range(KILLS):
        for topic in topics:
            sent[topic] += _produce(kafka.bootstrap, topic, rng, i * each, each)
        logs = [tmp_path / f"run-{i}-{j}.log" for j in range(2 if i == 0 else 1)]  # two writers at once first
        runs = [_run(s, log) for log in logs]
        if i == KILLS // 2:  # the broker goes away while they read
            _wait(runs, functools.partial(_reading, runs, logs))
            before = _reading(runs, logs)
            kafka.stop()
            reading_at_outage = [name for name in _reading(runs, logs) if name in before]
            time.sleep(2)
            kafka.start()
        _wait(runs, functools.partial(_worked_to, logs, _worked(logs) + rng.randint(1, 12)))
        time.sleep(rng.uniform(0, 0.5))
        for run, log in zip(runs, logs):
            alive = run.poll() is None
            if alive:
                os.killpg(run.pid, signal.SIGKILL)
            run.wait()
            phase, line = _where(log, alive)
            mid_work += phase in WORK
            sites.append(f"{log.name}: {'killed in ' if alive else ''}{phase}: {line[:160]}")
    where = "\n".join([*sites, f"the broker stopped while these were alive and ingesting: {reading_at_outage}"])
    print(where)
    assert 2 * mid_work >= len(sites), f"fewer than half the processes were killed in ingest or compaction:\n{where}"
    assert reading_at_outage, f"the broker stopped while no process was alive and ingesting:\n{where}"

    run_ingest(s)  # one clean run
    run_compaction(s, force=True)
    for topic in topics:
        table = topic.rsplit(".", 1)[1]
        rows = log_rows(s, table)
        assert sorted((r["partition"], r["sequence_number"]) for r in rows) == sorted(sent[topic]), (
            f"every event produced to {topic} once in the log of {table}"
        )
        assert_tables_match_the_model_of(s, table, rows)

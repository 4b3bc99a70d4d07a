"""The job that stays up (`cdclake run --every`): which failures it waits out, how long, and
what `/ready` says; then a real SIGTERM in the middle of a round of a real run."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from connector import service
from connector.core.errors import ConcurrentWriterError, ConfigError, SourceError
from iceberg.leases import LeaseHeldError
from quotas.errors import QuotaConfigError, QuotaExceededError


@pytest.mark.parametrize(
    "error,retried",
    [
        (SourceError("Kafka at 127.0.0.1:9 unreachable for 60s"), True),
        (LeaseHeldError("table t: compaction on h pid 1 is running"), True),
        (ConcurrentWriterError("table t: another writer"), True),
        (OSError(errno.ENOSPC, "No space left on device", "/lake/warehouse/ns/t__log/data/x.parquet"), True),
        (ConfigError("source.path: set the replay file"), False),
        (QuotaConfigError("table 't': compaction is not supported on the basic tier"), False),
        (QuotaExceededError([]), False),
        (ValueError("a bug"), False),  # shown with its trace
    ],
)
def test_what_a_round_waits_out(error, retried):
    assert service.retryable(error) is retried


@pytest.mark.parametrize(
    "every,failed,wait", [(60, 1, 60), (60, 2, 120), (60, 3, 240), (60, 4, 300), (60, 30, 300), (0, 1, 1), (0, 3, 4)]
)
def test_the_backoff_doubles_from_the_interval_and_is_bounded(every, failed, wait):
    assert service.backoff(every, failed) == wait


def test_rounds_go_on_through_passing_failures_and_stop_at_a_permanent_one(monkeypatch):
    monkeypatch.setattr(service, "MIN_BACKOFF_S", 0.01)
    stop, ready, said, seen = threading.Event(), threading.Event(), [], []
    outcomes = [SourceError("broker away"), SourceError("broker away"), None, LeaseHeldError("held"), None]

    def one_round():
        seen.append(ready.is_set())
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        if not outcomes:
            stop.set()

    service.run_forever(0.0, one_round, stop, ready, said.append)
    assert seen == [False, False, False, True, False]  # ready after a success, not after a failure
    assert ready.is_set() and len(said) == 3
    assert said[1] == "round failed (broker away); retrying in 0.02 s (failure 2 in a row)"
    assert said[2].endswith("retrying in 0.01 s (failure 1 in a row)")  # the count starts again

    def bad_config():
        raise ConfigError("catalog.uri: bad")

    with pytest.raises(ConfigError):
        service.run_forever(0.0, bad_config, threading.Event(), threading.Event(), said.append)


def _lines(first: int, n: int) -> list[str]:
    """kcat lines of creates over 50 keys, offsets `first`..."""
    from tests.conftest import kcat_lines

    values = [
        json.dumps({"op": "c", "after": {"id": i % 50, "n": i}, "source": {"connector": "postgresql", "lsn": 10 + i}})
        for i in range(first, first + n)
    ]
    keys = [{"id": i % 50} for i in range(first, first + n)]
    lines = kcat_lines("db.s.things", values, keys, ts0=int(time.time() * 1000))  # inside the log retention
    return [json.dumps(json.loads(line) | {"offset": first + k}) for k, line in enumerate(lines)]


def _ready(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


@pytest.mark.spark
@pytest.mark.slow
def test_sigterm_in_a_round_ends_after_a_committed_batch_and_a_rerun_adds_each_event_once(spark, settings, tmp_path):
    from iceberg.catalog import load_catalog
    from tests.iceberg.helpers import compact_table, names, offsets_by_key, run_ingest, with_source, write_lines
    from tests.model import expected_tables

    stream = write_lines(tmp_path / "in.jsonl", _lines(0, 200))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "CDCLAKE_WORK_DIR": str(settings.work_dir),
        "CDCLAKE_CATALOG__NAMESPACE": settings.catalog.namespace,
        "CDCLAKE_SOURCE__PATH": str(stream),
        "CDCLAKE_SOURCE__BATCH_SIZE": "500",
        "CDCLAKE_SPARK__MASTER": "local[2]",
    }
    out = open(tmp_path / "run.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "connector.cli", "run", "--every", "1", "--metrics-port", str(port)],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        statuses = set()
        deadline = time.monotonic() + 240
        while _ready(port) != 200:  # the first round: all 200 events in, compacted
            statuses.add(_ready(port))
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()
            time.sleep(0.2)
        assert 503 in statuses  # not ready before it
        write_lines(stream, stream.read_text().splitlines() + _lines(200, 20_000))  # 40 batches to come
        log = names(settings, "things").log
        while load_catalog(settings).load_table(log).scan().count() <= 200:  # a batch of the second round is in
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0, (tmp_path / "run.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    said = (tmp_path / "run.log").read_text()
    assert "stopped: the last batch and round are committed" in said, said
    held = load_catalog(settings).load_table(log).scan().count()
    assert 200 < held < 20_200 and held % 500 == 0  # whole batches only (of 500 lines of the file)
    s = with_source(settings, stream)
    run_ingest(s)
    compact_table(spark, s, "things")
    offsets = [r["offset"] for r in load_catalog(s).load_table(log).scan().to_arrow().to_pylist()]
    assert sorted(map(int, offsets)) == list(range(20_200))  # each once
    from tests.iceberg.helpers import decoded

    state, tombstones = expected_tables(decoded(stream, s), "source")
    assert offsets_by_key(s, names(s, "things").state) == state and not tombstones

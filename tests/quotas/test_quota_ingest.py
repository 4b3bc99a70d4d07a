"""Quotas enforced at ingest on real Iceberg tables: refusals, dead letters, backpressure."""

from __future__ import annotations

import json
import time

import pytest

from connector.app import run_ingest, status
from connector.core.config import CustomTier, TableConfig
from iceberg.catalog import load_catalog
from quotas.errors import QuotaExceededError
from tests.iceberg.helpers import names, offsets_by_key, with_source, write_lines

TOPIC = "db.s.things"
NOW_MS = int(time.time() * 1000)


def line(partition: int, offset: int, key: int, pad: int = 150, table: str = "things") -> str:
    value = {
        "op": "u",
        "after": {"id": key, "pad": "x" * pad},
        "source": {"connector": "postgresql", "table": table, "lsn": 1000 * partition + offset},
    }
    return json.dumps(
        {
            "topic": TOPIC.replace("things", table),
            "partition": partition,
            "offset": offset,
            "ts": NOW_MS + offset,  # enqueued now: inside the log retention of the rounds backpressure runs
            "key": json.dumps({"id": key}),
            "payload": json.dumps(value),
        }
    )


def quota_settings(settings, path, limit: int, policy: str = "fail", tier: str = "tiny"):
    """A table `things` on tier `tier`; `tiny` holds `limit` bytes per partition, events up to 600 bytes."""
    s = with_source(settings, path)
    tiny = CustomTier(compacted_bytes_per_partition=limit, max_event_bytes=600)
    return s.model_copy(
        update={
            "source": s.source.model_copy(update={"batch_size": 5}),
            "quotas": s.quotas.model_copy(update={"policy": policy, "custom": {"tiny": tiny}}),
            "tables": {"things": TableConfig(tier=tier)},
        }
    )


def log_offsets(s) -> list[tuple[int, int]]:
    t = load_catalog(s).load_table(names(s, "things").log)
    return sorted(
        (r["partition"], r["sequence_number"])
        for r in t.scan(selected_fields=("partition", "sequence_number")).to_arrow().to_pylist()
    )


@pytest.mark.spark
def test_oversize_events_go_to_dead_letters_with_their_size(settings, tmp_path):
    path = write_lines(tmp_path / "in.jsonl", [line(0, 0, 1), line(0, 1, 2, pad=700), line(0, 2, 3)])
    s = quota_settings(settings, path, limit=10**9)
    run_ingest(s)
    dead = load_catalog(s).load_table(names(s, "things").dead_letters).scan().to_arrow().to_pylist()
    assert [(d["offset"], d["reason"]) for d in dead] == [("1", "size")]
    assert "over the tiny tier limit of 600 bytes" in dead[0]["detail"] and "bytes" in dead[0]["detail"]
    assert log_offsets(s) == [(0, 0), (0, 2)]


@pytest.mark.spark
def test_unique_keys_fill_a_partition_then_a_higher_tier_takes_the_rest_exactly_once(settings, tmp_path):
    # partition 0: 30 unique keys (about 270 bytes each); partition 1: 3 small events
    lines = [line(0, i, i) for i in range(30)] + [line(1, i, 100 + i, pad=1) for i in range(3)]
    path = write_lines(tmp_path / "in.jsonl", lines)
    s = quota_settings(settings, path, limit=2000)
    with pytest.raises(QuotaExceededError) as e:
        run_ingest(s)
    msg = str(e.value)
    for part in ("'things'", f"{TOPIC}:0", "tier tiny", "limit 2,000 bytes", "cdclake compact", "raise the tier"):
        assert part in msg
    from prometheus_client import generate_latest

    metrics = generate_latest().decode()
    assert f'cdclake_quota_refusals_total{{stream="{TOPIC}:0",table="things"}}' in metrics
    assert 'cdclake_partition_quota_bytes{stream="db.s.things:0",table="things"} 2000.0' in metrics
    committed = log_offsets(s)
    assert committed == [(0, i) for i in range(len(committed))] and 0 < len(committed) < 30
    # raise the tier and restart: every refused event lands once, nothing twice
    s2 = quota_settings(settings, path, limit=10**9, tier="standard")
    run_ingest(s2)
    run_ingest(s2)
    assert log_offsets(s2) == [(0, i) for i in range(30)] + [(1, i) for i in range(3)]
    rows = {r.stream: r for r in status(s2)}
    assert rows[f"{TOPIC}:0"].quota_bytes == 1024**3 and rows[f"{TOPIC}:0"].usage_bytes > 2000


@pytest.mark.spark
@pytest.mark.slow
def test_updates_to_few_keys_recover_through_compaction_under_backpressure(spark, settings, tmp_path):
    lines = [line(0, i, i % 2) for i in range(30)]
    path = write_lines(tmp_path / "in.jsonl", lines)
    s = quota_settings(settings, path, limit=2500, policy="backpressure")
    stats = run_ingest(s)
    assert stats.accepted["things"] == 30
    assert log_offsets(s) == [(0, i) for i in range(30)]
    from tests.iceberg.helpers import compact_table

    compact_table(spark, s, "things")
    assert offsets_by_key(s, names(s, "things").state) == {'{"id":0}': "28", '{"id":1}': "29"}


@pytest.mark.spark
def test_backpressure_fails_when_compaction_cannot_free_enough(spark, settings, tmp_path):
    path = write_lines(tmp_path / "in.jsonl", [line(0, i, i) for i in range(20)])
    s = quota_settings(settings, path, limit=2000, policy="backpressure")
    with pytest.raises(QuotaExceededError, match="tier tiny"):
        run_ingest(s)

"""Tiers as data, start-up validation and the admit decision (pure, no Spark)."""

import pyarrow as pa
import pytest

from connector.core.config import load_settings
from quotas.admit import oversized, refuse, size_detail, validate_table
from quotas.errors import QuotaConfigError
from quotas.ledger import QuotaGate, table_quota
from quotas.tiers import GB, KB, MB, TIERS


@pytest.mark.parametrize(
    "tier,compaction,size,event,partitions,days,groups",
    [
        ("basic", False, None, 256 * KB, 32, 1, 1),
        ("standard", True, 1 * GB, 1 * MB, 32, 7, 20),
        ("premium", True, 250 * GB, 1 * MB, 100, 90, 100),
        ("dedicated", True, 250 * GB, 1 * MB, 1024, 90, 1000),
    ],
)
def test_tier_limits(tier, compaction, size, event, partitions, days, groups):
    q = TIERS[tier]
    assert (
        q.compaction_supported,
        q.compacted_bytes_per_partition,
        q.max_event_bytes,
        q.max_partitions,
        q.max_retention_days,
        q.consumer_groups,
    ) == (compaction, size, event, partitions, days, groups)


@pytest.mark.parametrize(
    "tier,kwargs,message",
    [
        ("basic", dict(compaction=True), "compaction is not supported on the basic tier"),
        ("standard", dict(partitions=33), "partitions = 33 exceeds the standard tier limit of 32"),
        ("standard", dict(log_retention_hours=24 * 8), "exceeds the standard tier limit of 7 days"),
        ("premium", dict(log_retention_hours=10, tombstone_retention_hours=11), "is longer than the log retention"),
    ],
)
def test_validation_names_table_setting_tier_and_limit(tier, kwargs, message):
    args = dict(compaction=True, partitions=None, log_retention_hours=24, tombstone_retention_hours=24) | kwargs
    with pytest.raises(QuotaConfigError, match="table 'orders'") as e:
        validate_table("orders", TIERS[tier], **args)
    assert message in str(e.value)


def test_valid_settings_pass():
    validate_table(
        "t", TIERS["basic"], compaction=False, partitions=32, log_retention_hours=24, tombstone_retention_hours=1
    )


def test_event_size_limit():
    assert oversized(TIERS["basic"], pa.array([1, 256 * KB, 256 * KB + 1])).to_pylist() == [False, False, True]
    assert "262,145 bytes, over the basic tier limit of 262,144" in size_detail(TIERS["basic"], 256 * KB + 1)


@pytest.mark.parametrize(
    "usage,incoming,refused",
    [
        ({}, {"t:0": (100, 5)}, []),
        ({"t:0": 900}, {"t:0": (100, 5)}, []),  # exactly at the limit is allowed
        ({"t:0": 901}, {"t:0": (100, 5)}, ["t:0"]),
        ({"t:0": 901, "t:1": 0}, {"t:0": (100, 5), "t:1": (100, 0)}, ["t:0"]),  # other partitions keep flowing
    ],
)
def test_refuse(usage, incoming, refused):
    quota = TIERS["standard"].with_overrides(compacted_bytes_per_partition=1000)
    out = refuse("t", quota, usage, incoming)
    assert [r.stream for r in out] == refused
    for r in out:
        assert r.first_refused == incoming[r.stream][1] and "standard" in r.message() and "1,000" in r.message()


def test_custom_tier_and_overrides_and_unknown_tier(tmp_path):
    s = load_settings(
        quotas={"custom": {"tiny": {"compacted_bytes_per_partition": 10, "max_event_bytes": 5}}},
        tables={"a": {"tier": "tiny"}, "b": {"tier": "premium", "max_event_bytes": 7}, "c": {"tier": "gold"}},
    )
    assert table_quota(s, "a").compacted_bytes_per_partition == 10
    assert table_quota(s, "b").max_event_bytes == 7 and table_quota(s, "b").name == "premium"
    assert table_quota(s, "z").name == "standard"
    with pytest.raises(QuotaConfigError, match=r"tables.c.tier = 'gold'"):
        table_quota(s, "c")


def test_gate_bounds_partitions_and_pauses():
    s = load_settings(
        quotas={"custom": {"two": {"compacted_bytes_per_partition": 100, "max_partitions": 2}}},
        tables={"t": {"tier": "two"}},
    )
    gate = QuotaGate(s)
    assert gate.admit("t", {"x:0": (60, 0), "x:1": (10, 0)}) == []
    gate.record("t", "x:0", 60)
    gate.record("t", "x:1", 10)
    assert [r.stream for r in gate.admit("t", {"x:0": (50, 3)})] == ["x:0"]
    assert gate.caps("t") == {"x:0": 3}
    assert gate.admit("t", {"x:0": (1, 9)}) == []  # already paused: stays capped at 3
    assert gate.caps("t") == {"x:0": 3}
    with pytest.raises(QuotaConfigError, match="3 partitions"):
        gate.admit("t", {"x:2": (1, 0)})


@pytest.mark.parametrize(
    "n,text",
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (256 * 1024, "256 KB"),
        (1024**2, "1 MB"),
        (1024**3, "1 GB"),
        (250 * 1024**3, "250 GB"),
        (1536 * 1024, "1.5 MB"),
    ],
)
def test_human_bytes(n, text):
    from quotas.tiers import human_bytes

    assert human_bytes(n) == text


@pytest.mark.parametrize("width", [60, 80, 200])
def test_quotas_never_cut_a_tier_name_or_a_limit(tmp_path, monkeypatch, width):
    from typer.testing import CliRunner

    from connector.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", str(width))
    out = CliRunner().invoke(app, ["quotas"]).output
    for word in ("dedicated", "250 GB", "256 KB", "1 GB", "1 MB"):
        assert word in out, out
    assert "…" not in out


def test_quotas_and_status_as_json(tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from connector.cli import app

    monkeypatch.chdir(tmp_path)
    got = json.loads(CliRunner().invoke(app, ["quotas", "--json"]).output)
    assert {t["name"]: t["compacted_bytes_per_partition"] for t in got[0]["tiers"]}["premium"] == 250 * 1024**3
    assert json.loads(CliRunner().invoke(app, ["status", "--json"]).output) == []

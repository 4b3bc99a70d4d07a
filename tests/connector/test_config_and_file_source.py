import json

import pytest

from connector.config import load_settings
from connector.errors import ConfigError, SourceError
from connector.sources.file import FileSource


def test_environment_overrides_file_and_errors_name_the_key(tmp_path, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[compaction]\ntombstone_retention_hours = 12\n[tables.orders]\nkey_fields = ["order_id"]\n')
    assert load_settings(cfg).compaction.tombstone_retention_hours == 12
    assert load_settings(cfg).key_fields() == {"orders": ["order_id"]}
    monkeypatch.setenv("CDCLAKE_COMPACTION__TOMBSTONE_RETENTION_HOURS", "48")
    assert load_settings(cfg).compaction.tombstone_retention_hours == 48
    monkeypatch.setenv("CDCLAKE_COMPACTION__MIN_CLEANABLE_DIRTY_RATIO", "2")
    with pytest.raises(ConfigError, match="compaction.min_cleanable_dirty_ratio"):
        load_settings(cfg)
    cfg.write_text("[compaction]\ntombstone_retention = 1\n")
    monkeypatch.delenv("CDCLAKE_COMPACTION__MIN_CLEANABLE_DIRTY_RATIO")
    with pytest.raises(ConfigError, match="compaction.tombstone_retention"):
        load_settings(cfg)


def test_file_source_reads_kcat_and_event_hubs_fields_and_seeks(tmp_path):
    f = tmp_path / "dump.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in [
        {"topic": "a.b.c", "partition": 1, "offset": 7, "ts": 1700000000000, "key": "k", "payload": None,
         "headers": ["h1", "v1", "h2", None]},
        {"topic": "a.b.c", "partition": 1, "offset": "4294967296", "sequence_number": 8, "partition_key": "pk",
         "enqueued_time": "2024-05-01T10:00:00Z", "key": "ignored", "payload": "{}"},
    ]) + "\n")
    src = FileSource(f)
    a, b = src.poll(10)
    assert a.value is None and a.headers == (("h1", b"v1"), ("h2", None)) and a.sequence_number == 7
    assert b.key == b"pk" and b.offset == "4294967296" and b.sequence_number == 8 and b.enqueued_time.year == 2024
    src.seek({"a.b.c:1": 8})
    assert [r.sequence_number for r in src.poll(10)] == [8]


def test_file_source_names_the_bad_line(tmp_path):
    f = tmp_path / "dump.jsonl"
    f.write_text('{"topic": "t", "partition": 0, "offset": 0, "payload": null}\nnot json\n')
    with pytest.raises(SourceError, match=r"dump.jsonl:2"):
        FileSource(f).poll(10)
    with pytest.raises(SourceError, match="no such file"):
        FileSource(tmp_path / "missing.jsonl")


def test_ingest_gc_thresholds_are_restored_even_when_a_batch_fails():
    import gc

    from connector.pipeline import batch_gc

    saved = gc.get_threshold()
    with pytest.raises(RuntimeError):
        with batch_gc(young=123_456):
            assert gc.get_threshold()[0] == 123_456
            raise RuntimeError("batch failed")
    assert gc.get_threshold() == saved


@pytest.mark.parametrize("starting,expected", [
    ("earliest", 10), ("latest", 20), (15, 15), (3, 10), (99, 20), ("time", 17),
])
def test_initial_position_of_a_partition_without_a_committed_position(starting, expected):
    from datetime import datetime, timezone

    from connector.sources import initial_position

    when = datetime(2024, 1, 1, tzinfo=timezone.utc)
    looked_up = []
    got = initial_position(when if starting == "time" else starting, 10, 20, lambda t: looked_up.append(t) or 17)
    assert got == expected and looked_up == ([when] if starting == "time" else [])

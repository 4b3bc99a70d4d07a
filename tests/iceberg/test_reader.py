"""The compacted-log reader (`cdclake read`, `iceberg.reader`) against a plain-Python model of
Event Hubs compaction over the same stream (tests/model.py `compacted_hub`): after a partial
compaction (the cleaned part and the uncompacted head), after a full one, as of the first
state snapshot, and filtered by partition and offset."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from iceberg.catalog import load_catalog
from iceberg.reader import compacted_log, read_arrow
from tests.iceberg.helpers import compact_table, names, run_ingest, with_source, write_lines
from tests.model import compacted_hub

pytestmark = pytest.mark.spark
TOPIC = "pg.inventory.things"


def _stream(n: int, seed: int = 7) -> list[dict]:
    """Creates, updates and deletes (each followed by its tombstone) over 15 keys in 3
    partitions (a key stays in its partition); positions rise with the offsets."""
    rng, offsets, alive, out = random.Random(seed), [0, 0, 0], set(), []

    def line(key: int, payload: str | None) -> None:
        part = key % 3
        out.append(
            {"topic": TOPIC, "partition": part, "offset": offsets[part], "ts": 1_700_000_000_000 + len(out),
             "key": json.dumps({"id": key}), "payload": payload}
        )  # fmt: skip
        offsets[part] += 1

    for i in range(n):
        key = rng.randrange(15)
        source = {"connector": "postgresql", "table": "things", "lsn": 100 + i}
        if key in alive and rng.random() < 0.25:
            line(key, json.dumps({"op": "d", "before": {"id": key}, "after": None, "source": source}))
            line(key, None)
            alive.discard(key)
        else:
            op = "u" if key in alive else "c"
            line(key, json.dumps({"op": op, "after": {"id": key, "v": i}, "source": source}))
            alive.add(key)
    return out


def _canonical(lines: list[dict]) -> list[dict]:
    """The lines with their keys as the log keeps them (compact JSON: the compaction key)."""
    return [x | {"key": json.dumps(json.loads(x["key"]), separators=(",", ":"))} for x in lines]


def _read(spark, s, **where) -> list[tuple]:
    t = read_arrow(spark, load_catalog(s), names(s, "things"), **where)
    return [
        (r["partition"], int(r["offset"]), r["key"], None if r["value"] is None else r["value"].decode())
        for r in t.to_pylist()
    ]


def test_the_reader_reads_what_a_consumer_of_the_compacted_hub_reads(spark, settings, tmp_path):
    raw = _stream(120)
    path = write_lines(tmp_path / "in.jsonl", [json.dumps(line) for line in raw])
    lines = _canonical(raw)
    s = with_source(settings, path, ordering="log")
    first = lines[:70]
    run_ingest(s, max_records=len(first))
    compact_table(spark, s, "things")
    catalog, n = load_catalog(s), names(s, "things")
    s1 = catalog.load_table(n.state).current_snapshot().snapshot_id
    run_ingest(s)
    points = {
        p: 1 + max(line["offset"] for line in first if line["partition"] == p) for p in {x["partition"] for x in first}
    }
    assert _read(spark, s) == compacted_hub(lines, points)  # the cleaned part, then the head
    compact_table(spark, s, "things")
    everything = compacted_hub(lines)
    assert _read(spark, s) == everything
    assert any(v is None for *_, v in everything)  # live tombstones among them
    assert _read(spark, s, as_of=s1) == compacted_hub(first)  # the log and tombstones as they were
    assert _read(spark, s, partition=1, from_offset=10) == [r for r in everything if r[0] == 1 and r[1] >= 10]
    assert compacted_log(spark, catalog, n).columns[:7] == [
        "topic", "partition", "offset", "sequence_number", "enqueued_time", "key", "value"
    ]  # fmt: skip

    from connector.cli import app

    env = {
        "CDCLAKE_WORK_DIR": str(s.work_dir),
        "CDCLAKE_CATALOG__NAMESPACE": s.catalog.namespace,
        "CDCLAKE_SOURCE__PATH": str(path),
    }
    result = CliRunner().invoke(app, ["read", "things", "--partition", "2"], env=env)
    assert result.exit_code == 0, result.output
    got = [json.loads(line) for line in result.output.splitlines()]
    assert [(r["partition"], int(r["offset"]), r["key"], r["value"]) for r in got] == [
        r for r in everything if r[0] == 2
    ]

"""Log retention over 16 rounds of a steady stream, an hour of events a round (the small rounds of
production, written through Iceberg's API): the log keeps what is younger than the retention
plus what the keys need (each live key's and tombstone's winning event, truncates), so its size
stays bounded while the state and tombstones remain those of the model of the whole stream, and
the reader and verify still work from it."""

from __future__ import annotations

import dataclasses
import json
import random
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import functions as F

from connector.app import policy_of, status
from iceberg.catalog import load_catalog
from iceberg.compaction.retention import may_be_older
from iceberg.reader import read_arrow
from iceberg.verify import RebuildRefusedError, rebuild, verify
from tests.iceberg.helpers import compact_table, decoded, names, offsets_by_key, run_ingest, with_source, write_lines
from tests.model import compacted_hub, expected_tables

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # 16 rounds
START = datetime(2030, 1, 1, tzinfo=UTC)
PER_ROUND, KEYS, RETENTION_H, ROUNDS = 30, 12, 2, 16


def _round(n: int, first_offset: int, rng: random.Random, alive: set) -> list[dict]:
    out = []
    for i in range(PER_ROUND):
        key, offset = rng.randrange(KEYS), first_offset + len(out)
        ts = int((START + timedelta(hours=n, seconds=i)).timestamp() * 1000)
        source = {"connector": "postgresql", "table": "things", "lsn": offset + 1}
        line = {"topic": "pg.inventory.things", "partition": 0, "ts": ts, "key": json.dumps({"id": key})}
        if key in alive and rng.random() < 0.2:
            out.append(line | {"offset": offset, "payload": json.dumps({"op": "d", "after": None, "source": source})})
            out.append(line | {"offset": offset + 1, "ts": ts + 1, "payload": None})
            alive.discard(key)
        else:
            payload = {"op": "u" if key in alive else "c", "after": {"id": key, "n": offset}, "source": source}
            out.append(line | {"offset": offset, "payload": json.dumps(payload)})
            alive.add(key)
    return out


def test_log_retention_bounds_the_log_over_16_rounds(spark, settings, tmp_path):
    rng, alive, lines, sizes, trimmed = random.Random(5), set(), [], [], []
    path = tmp_path / "in.jsonl"
    s = with_source(settings, path, log_retention_hours=RETENTION_H, tombstone_retention_hours=2)
    log = names(s, "things").log
    for n in range(ROUNDS):
        lines += _round(n, len(lines), rng, alive)
        write_lines(path, [json.dumps(x) for x in lines])
        run_ingest(s)
        now = START + timedelta(hours=n, minutes=30)
        # the trigger's count from the log's commits: at least the rows older than the cut-off
        # (counted by Spark), less than all (this round's are younger)
        cutoff, table = now - timedelta(hours=RETENTION_H), load_catalog(s).load_table(log)
        older = spark.table(names(s, "things").spark(log)).where(F.col("enqueued_time") < F.lit(cutoff)).count()
        total = int(table.current_snapshot().summary["total-records"])
        assert older <= may_be_older(table, cutoff) < total
        report = compact_table(spark, s, "things", now=now, packed=False, log_retention=True)  # as in production
        sizes.append(load_catalog(s).load_table(log).scan().count())
        trimmed.append(report.trimmed)
    # what the log may hold: the last RETENTION_H + 1 rounds, one winner per key and tombstone,
    # and as many old rows again before a trim is due
    bound = (RETENTION_H + 1) * PER_ROUND * 2 + 2 * 2 * KEYS
    assert sum(1 for t in trimmed if t) >= ROUNDS // 2, trimmed
    assert max(sizes[RETENTION_H + 4 :]) <= bound < len(lines) / 2, sizes
    events = decoded(path, s)
    state, tombstones = expected_tables(events, "source")
    assert offsets_by_key(s, names(s, "things").state) == state
    held = offsets_by_key(s, names(s, "things").tombstones)  # the model's, less those purged after 2 h
    assert held.items() <= tombstones.items()
    live = [x for x in compacted_hub(lines) if x[3] is not None]  # the live keys' latest events
    got = read_arrow(spark, load_catalog(s), names(s, "things"))
    assert [(r["offset"], r["value"].decode()) for r in got.to_pylist() if r["value"] is not None] == [
        (str(o), v) for _, o, _, v in live
    ]
    assert verify(spark, load_catalog(s), names(s, "things"), policy_of(s), now).ok
    (shown,) = status(s, now)  # the log's oldest retained position: that of the oldest winner kept
    kept = load_catalog(s).load_table(log).scan(selected_fields=("sequence_number",)).to_arrow()
    assert shown.log_from == min(kept["sequence_number"].to_pylist()) > 0
    # a rebuild by the same rule recomputes the same tables from what is kept; by another, it is refused
    with pytest.raises(RebuildRefusedError, match="log retention removed the events"):
        rebuild(spark, load_catalog(s), names(s, "things"), dataclasses.replace(policy_of(s), ordering="log"), now)
    rebuild(spark, load_catalog(s), names(s, "things"), policy_of(s), now)
    assert offsets_by_key(s, names(s, "things").state) == state


def test_dead_letters_past_the_retention_go_and_the_young_stay(spark, settings, tmp_path):
    """A round's trim removes the dead letters older than the log retention's cut-off and
    keeps the younger ones; while none is older, the dead letters' commits say so
    (`may_be_older`) and the round leaves their table as it is."""
    rng, alive, lines = random.Random(7), set(), []
    path = tmp_path / "in.jsonl"
    s = with_source(settings, path, log_retention_hours=RETENTION_H, tombstone_retention_hours=RETENTION_H)
    t = names(s, "things")

    def ingest_hour(hour: int) -> None:  # an hour's events, then a dead letter (its payload is not JSON)
        lines.extend(_round(hour, len(lines), rng, alive))
        ts = int((START + timedelta(hours=hour, minutes=59)).timestamp() * 1000)
        bad = {"topic": "pg.inventory.things", "partition": 0, "offset": len(lines), "ts": ts}
        lines.append(bad | {"key": json.dumps({"id": 0}), "payload": "{not json"})
        write_lines(path, [json.dumps(x) for x in lines])
        run_ingest(s)

    def dead_letters() -> list[int]:
        return sorted(load_catalog(s).load_table(t.dead_letters).scan().to_arrow()["sequence_number"].to_pylist())

    ingest_hour(0)
    now = START + timedelta(hours=RETENTION_H)  # the dead letter, at 0:59, is younger than the cut-off
    dl = load_catalog(s).load_table(t.dead_letters)
    assert may_be_older(dl, now - timedelta(hours=RETENTION_H)) == 0
    compact_table(spark, s, "things", now=now, packed=False, log_retention=True)
    assert load_catalog(s).load_table(t.dead_letters).snapshots() == dl.snapshots()
    ingest_hour(3)
    old, young = dead_letters()  # at 0:59 and 3:59; the cut-off is at 3:00
    compact_table(spark, s, "things", now=START + timedelta(hours=3 + RETENTION_H), packed=False, log_retention=True)
    assert old < young and dead_letters() == [young]

"""Tombstones: they guard their key within the retention, then a purge removes them, and
whether one may have expired is told from what the tombstones' commits record (Spark and real
Iceberg tables)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from pyiceberg.table import Table
from pyspark.sql import functions as F

from iceberg.catalog import load_catalog
from iceberg.compaction import writes
from iceberg.compaction.report import may_expire
from iceberg.summary_keys import EXPIRES_FROM, NEVER, STREAM_BYTES
from tests.conftest import kcat_lines
from tests.iceberg.helpers import (
    NOW,
    assert_recorded_bytes_are_held,
    compact_table,
    names,
    offsets_by_key,
    pg,
    run_ingest,
    with_source,
    write_lines,
)

pytestmark = pytest.mark.spark


def test_tombstones_guard_within_retention_then_are_purged(spark, settings, tmp_path):
    f = tmp_path / "in.jsonl"
    s = with_source(
        settings,
        write_lines(f, kcat_lines("db.s.things", [pg("c", 1, 10), pg("d", 1, 20), None], [{"id": 1}] * 3)),
        tombstone_retention_hours=24,
    )
    run_ingest(s)
    compact_table(spark, s, "things", now=NOW)
    tombs = names(s, "things").tombstones
    assert offsets_by_key(s, tombs) == {'{"id":1}': "2"}
    # a late older event inside the window does not resurrect the key
    late = json.loads(kcat_lines("db.s.things", [pg("u", 1, 15)], [{"id": 1}])[0]) | {"offset": 3}
    write_lines(f, f.read_text().splitlines() + [json.dumps(late)])
    run_ingest(s)
    r = compact_table(spark, s, "things", now=NOW + timedelta(hours=23))
    assert r.stale == 1 and offsets_by_key(s, names(s, "things").state) == {}
    assert_recorded_bytes_are_held(s, "things")
    assert compact_table(spark, s, "things", now=NOW + timedelta(hours=24, seconds=1)).purged == 1
    assert offsets_by_key(s, tombs) == {}
    assert_recorded_bytes_are_held(s, "things")  # the purge's commit records what is left


def test_whether_a_tombstone_may_have_expired_is_told_by_the_tombstones_commits(spark, settings, tmp_path):
    """Each round's commit to the tombstones records their earliest expiry: at or before
    every tombstone's `expires_at` (read here by Spark), exact after a purge; the purge's
    decision reads it without planning a file. A table whose newest commit of its bytes does
    not record it (written before the key was) is told by its files."""
    keys = [{"id": 1}] * 3 + [{"id": 2}] * 3 + [{"id": 1}]
    events = [pg("c", 1, 10), pg("d", 1, 11), None, pg("c", 2, 12), pg("d", 2, 13), None, pg("c", 1, 14)]
    lines = kcat_lines("db.s.things", events, keys)
    f = write_lines(tmp_path / "in.jsonl", lines[:3])
    s = with_source(settings, f, tombstone_retention_hours=24)
    t, catalog, day = names(s, "things"), load_catalog(s), timedelta(hours=24)

    def recorded():
        return EXPIRES_FROM.read(catalog.load_table(t.tombstones), with_key=STREAM_BYTES)

    def expiries():
        rows = spark.table(t.spark(t.tombstones)).select(F.unix_micros("expires_at")).collect()
        return [datetime.fromtimestamp(0, UTC) + timedelta(microseconds=us) for (us,) in rows]

    def may_expire_unplanned(now):  # the decision from the commits alone: no scan planned
        with mock.patch.object(Table, "scan", side_effect=AssertionError("a scan was planned")):
            return may_expire(catalog, t.tombstones, now)

    run_ingest(s)
    compact_table(spark, s, "things", now=NOW)
    assert expiries() == [NOW + day] and recorded() == NOW + day
    # key 2 deleted an hour later, key 1 written again: its tombstone goes, and the record stays
    # (a round lowers it, only a purge raises it)
    write_lines(f, lines)
    run_ingest(s)
    compact_table(spark, s, "things", now=NOW + timedelta(hours=1))
    assert expiries() == [NOW + timedelta(hours=25)] and recorded() == NOW + day
    assert not may_expire_unplanned(NOW + timedelta(hours=1))
    # a round past the record purges none and records the remaining tombstones' earliest expiry
    assert compact_table(spark, s, "things", now=NOW + day + timedelta(seconds=1)).purged == 0
    assert expiries() == [NOW + timedelta(hours=25)] and recorded() == NOW + timedelta(hours=25)
    assert not may_expire_unplanned(NOW + day + timedelta(seconds=2))
    assert may_expire_unplanned(NOW + timedelta(hours=25))
    # a commit of the bytes alone, as made before the key was: the files tell
    tombstones = catalog.load_table(t.tombstones)
    writes.record(spark, t.spark(t.tombstones), STREAM_BYTES.entry(STREAM_BYTES.read(tombstones) or {}))
    assert recorded() is None
    assert not may_expire(catalog, t.tombstones, NOW + timedelta(hours=25) - timedelta(microseconds=1))
    assert may_expire(catalog, t.tombstones, NOW + timedelta(hours=25))
    assert compact_table(spark, s, "things", now=NOW + timedelta(hours=25)).purged == 1
    assert expiries() == [] and recorded() == NEVER
    assert not may_expire_unplanned(NOW + timedelta(days=400))
    assert_recorded_bytes_are_held(s, "things")

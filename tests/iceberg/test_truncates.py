"""Truncates (Spark): a truncate removes every older key and writes no tombstone, keeps an
earlier delete's own tombstone whichever round it lands in, stays a marker after the
tombstones are purged, and under log ordering compares enqueued times."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from iceberg.catalog import load_catalog
from iceberg.compaction.stats import load_optional
from tests.conftest import kcat_lines
from tests.iceberg.helpers import (
    NOW,
    compact_table,
    decoded,
    kline,
    names,
    offsets_by_key,
    pg,
    run_ingest,
    with_source,
    write_lines,
)
from tests.model import expected_tables, stale_events

pytestmark = pytest.mark.spark


def _truncate(lsn):
    return json.dumps({"op": "t", "source": {"connector": "postgresql", "table": "things", "lsn": lsn}})


def test_truncate_removes_every_older_key_and_writes_no_tombstones(spark, settings, tmp_path):
    values = [pg("c", 1, 10), pg("c", 2, 11), _truncate(12), pg("c", 3, 13)]
    s = with_source(
        settings,
        write_lines(tmp_path / "in.jsonl", kcat_lines("db.s.things", values, [{"id": 1}, {"id": 2}, None, {"id": 3}])),
    )
    run_ingest(s)
    report = compact_table(spark, s, "things")
    assert (report.truncates, report.truncated) == (1, 2)
    assert offsets_by_key(s, names(s, "things").state) == {'{"id":3}': "3"}
    assert offsets_by_key(s, names(s, "things").tombstones) == {}


# c key 1 (p0); c key 2 (p1); d key 2 and its tombstone (p1); a truncate on p3 (lsn 40)
DELETE_THEN_TRUNCATE = [
    kline(0, 0, 1, pg("c", 1, 10), 0),
    kline(1, 0, 2, pg("c", 2, 20), 1),
    kline(1, 1, 2, pg("d", 2, 30), 2),
    kline(1, 2, 2, None, 3),
    kline(3, 0, None, _truncate(40), 4),
]


@pytest.mark.parametrize("cut", [None, 4, 2])
def test_a_truncate_keeps_an_earlier_deletes_own_tombstone(spark, settings, tmp_path, cut):
    """Whichever round the truncate lands in, key 2's tombstone is its own: partition 1, the
    offset of its tombstone record, the delete's position; key 1 is gone."""
    s = with_source(settings, write_lines(tmp_path / "in.jsonl", DELETE_THEN_TRUNCATE))
    for n in [cut, None] if cut else [None]:
        run_ingest(s, max_records=n)
        compact_table(spark, s, "things")
    t = names(s, "things")
    assert offsets_by_key(s, t.state) == {}
    rows = load_catalog(s).load_table(t.tombstones).scan().to_arrow().to_pylist()
    assert [(r["_key"], r["_partition_id"], r["_offset"], r["_source_position"]) for r in rows] == [
        ('{"id":2}', 1, "2", [30])
    ]


def test_under_log_ordering_a_truncate_compares_enqueued_times(spark, settings, tmp_path):
    """Round 1: c A (p0), c B (p2). Round 2: a truncate on p1, then c C (p0) enqueued after it:
    A and B go, C stays, and later events on low partitions are not stale."""
    lines = [
        kline(0, 0, 1, pg("c", 1, 10), 0),
        kline(2, 0, 2, pg("c", 2, 11), 1),
        kline(1, 0, None, _truncate(12), 2),
        kline(0, 1, 3, pg("c", 3, 13), 3),
    ]
    s = with_source(settings, write_lines(tmp_path / "in.jsonl", lines), ordering="log")
    run_ingest(s, max_records=2)
    compact_table(spark, s, "things")
    run_ingest(s)
    report = compact_table(spark, s, "things")
    assert report.truncated == 2 and report.stale == 0
    assert offsets_by_key(s, names(s, "things").state) == {'{"id":3}': "1"}
    assert offsets_by_key(s, names(s, "things").tombstones) == {}


@pytest.mark.parametrize("ordering", ["source", "log"])
def test_an_event_older_than_the_truncate_marker_stays_stale_after_tombstones_are_purged(
    spark, settings, tmp_path, ordering
):
    """The truncate is a table-level marker, never purged: a later-arriving change older than
    it does not resurrect its key, even once every tombstone has expired."""
    f = tmp_path / "in.jsonl"
    first = [
        kline(0, 0, 1, pg("c", 1, 10), 0),
        kline(0, 1, 1, pg("d", 1, 11), 1),
        kline(0, 2, 1, None, 2),
        kline(1, 0, None, _truncate(20), 10),
    ]
    s = with_source(settings, write_lines(f, first), ordering=ordering, tombstone_retention_hours=1)
    run_ingest(s)
    compact_table(spark, s, "things", now=NOW)
    assert compact_table(spark, s, "things", now=NOW + timedelta(hours=2)).purged == 1
    # late: key 2 created before the truncate (lsn 15, enqueued at 5), delivered on partition 2 now
    write_lines(f, first + [kline(2, 0, 2, pg("c", 2, 15), 5)])
    run_ingest(s)
    report = compact_table(spark, s, "things", now=NOW + timedelta(hours=3))
    assert report.stale_reasons == {"older_than_truncate": 1} and report.upserts == 0
    t = names(s, "things")
    assert offsets_by_key(s, t.state) == {} and offsets_by_key(s, t.tombstones) == {}
    rows = load_catalog(s).load_table(t.stale).scan().to_arrow().to_pylist()
    assert [(r["_key"], r["_partition_id"], r["_offset"], r["reason"]) for r in rows] == [
        ('{"id":2}', 2, "0", "older_than_truncate")
    ]


HELD_AFTER_A_TRUNCATE = {
    # a tombstone held from p1 (enqueued at 5); then a truncate on p2 enqueued at 3 and an
    # update on p0 enqueued at 1: the update comes before the truncate, the tombstone after it
    "log": [
        kline(1, 0, 1, pg("d", 1, 20), 5),
        kline(2, 0, None, _truncate(30), 3),
        kline(0, 0, 1, pg("u", 1, 40), 1),
    ],
    # an update held at LSN 20; then a truncate at LSN 10 and an update at LSN 15: both
    # updates come after the truncate, and the later-arriving one is older than the held one
    "source": [
        kline(0, 0, 1, pg("u", 1, 20), 0),
        kline(2, 0, None, _truncate(10), 1),
        kline(0, 1, 1, pg("u", 1, 15), 2),
    ],
}


@pytest.mark.parametrize("ordering", ["source", "log"])
def test_a_held_row_comes_in_after_the_truncates_it_is_newer_than(spark, settings, tmp_path, ordering):
    """A row an earlier round left competes with the round's changes after the same truncates
    it is newer than (not before all of the round's truncates): the tables and the stale
    events are the model's."""
    lines = HELD_AFTER_A_TRUNCATE[ordering]
    path = write_lines(tmp_path / "in.jsonl", lines)
    s = with_source(settings, path, ordering=ordering)
    run_ingest(s, max_records=1)
    compact_table(spark, s, "things")
    run_ingest(s)
    compact_table(spark, s, "things")
    events = decoded(path, s)
    state, tombstones = expected_tables(events, ordering)
    t = names(s, "things")
    assert (offsets_by_key(s, t.state), offsets_by_key(s, t.tombstones)) == (state, tombstones)
    stale = load_optional(load_catalog(s), t.stale)
    rows = [] if stale is None else stale.scan().to_arrow().to_pylist()
    got = sorted((r["_partition_id"], r["_sequence_number"], r["reason"]) for r in rows)
    assert got == stale_events([events[:1], events[1:]], ordering)

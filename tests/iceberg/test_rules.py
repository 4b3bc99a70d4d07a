"""The retain rule, the truncate rule and the compaction planner, table-driven: the rules as
the Spark columns and SQL the job runs, the planner without Spark."""

from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import functions as F

from connector.core.ordering import Truncate
from iceberg.compaction.dedupe import candidate_order, older_than_truncate
from iceberg.compaction.policy import CleanRange, CompactionPolicy, StreamStats, plan
from iceberg.compaction.retain import action, purge_predicate
from iceberg.layouts import META_COLUMNS, POSITION_TEXT

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)

# (op, the tombstone's expires_at, what the newest change of a key keeps at NOW)
FATES = [
    ("c", None, "row"),
    ("u", NOW - timedelta(days=9), "row"),
    ("r", None, "row"),
    ("d", NOW + timedelta(seconds=1), "tombstone"),
    ("d", None, "tombstone"),
    ("d", NOW, "nothing"),  # retention is "at least": expired exactly at expires_at
    ("d", NOW - timedelta(hours=1), "nothing"),
]


@pytest.mark.spark
def test_retain_rule(spark):
    """The table above through the Spark column (a row or a tombstone) and the SQL predicate
    (the purge of an expired tombstone) the job runs."""
    df = spark.createDataFrame([(op, e) for op, e, _ in FATES], "op string, expires_at timestamp")
    got = df.select(
        action(df.op).alias("a"), df.expires_at.isNotNull().alias("known"), F.expr(purge_predicate(NOW)).alias("purged")
    ).collect()
    for (op, expires_at, expected), r in zip(FATES, got):
        kept = "row" if r["a"] == "upsert" else "nothing" if r["known"] and r["purged"] else "tombstone"
        assert kept == expected, (op, expires_at)


# A truncate on partition 1 at offset 5, enqueued at t=100 us, at source position (50,).
T = Truncate("db.s.things", 1, "5", 5, 100, (50,))

# (position, snapshot, partition, sequence number, enqueued us, ordering, older than T)
TRUNCATE_CASES = [
    ((49,), False, 0, 9, 200, "source", True),  # an earlier position, whatever its offset or time
    ((51,), False, 0, 0, 1, "source", False),
    ((50,), True, 1, 9, 200, "source", True),  # a snapshot read at the truncate's own position
    (None, False, 0, 9, 200, "source", True),  # no position is older than any
    (None, False, 0, 9, 99, "log", True),  # another partition: enqueued before it
    (None, False, 0, 0, 101, "log", False),  # another partition, enqueued after it, a lower offset
    (None, False, 2, 99, 99, "log", True),  # a higher offset on another partition says nothing
    (None, False, 1, 4, 500, "log", True),  # its own partition: the offset decides
    (None, False, 1, 6, 50, "log", False),
]


@pytest.mark.spark
@pytest.mark.parametrize("ordering", ["source", "log"])
def test_truncate_rule(spark, ordering):
    """The table above through the Spark column the job runs over a round's candidates."""
    cases = [c for c in TRUNCATE_CASES if c[5] == ordering]
    rows = [("db.s.things", part, seq, us, pos and list(pos), snap) for pos, snap, part, seq, us, _, _ in cases]
    df = spark.createDataFrame(
        rows,
        "_topic string, _partition_id int, _sequence_number long, us long, _source_position array<bigint>,"
        " _snapshot boolean",
    ).withColumn("_enqueued_time", F.timestamp_micros("us"))
    got = df.withColumn("_o", candidate_order(ordering)).select(older_than_truncate(T, ordering)).collect()
    assert [r[0] for r in got] == [c[6] for c in cases]


def stats(point=0, clean=0, cleanable=100, end=10, first=NOW - timedelta(minutes=5)):
    return StreamStats("t:0", point, clean, cleanable, cleanable, end, first, end - point)


@pytest.mark.parametrize(
    "s,policy,force,expected",
    [
        (stats(clean=0), CompactionPolicy(), False, [CleanRange("t:0", 0, 10)]),  # nothing clean yet: ratio 1
        (stats(clean=100, cleanable=100), CompactionPolicy(), False, [CleanRange("t:0", 0, 10)]),  # ratio 0.5
        (stats(clean=101, cleanable=100), CompactionPolicy(), False, []),  # below min_cleanable_dirty_ratio
        (stats(clean=101, cleanable=100), CompactionPolicy(), True, [CleanRange("t:0", 0, 10)]),  # forced
        (
            stats(clean=1000, cleanable=1),
            CompactionPolicy(max_compaction_lag=timedelta(minutes=1)),
            False,
            [CleanRange("t:0", 0, 10)],
        ),  # overdue by max_compaction_lag
        (stats(clean=1000, cleanable=1), CompactionPolicy(max_compaction_lag=timedelta(hours=1)), False, []),
        (stats(point=10, end=10), CompactionPolicy(), True, []),  # nothing old enough (min_compaction_lag)
    ],
)
def test_plan(s, policy, force, expected):
    assert plan([s], policy, NOW, force) == expected


@pytest.mark.spark
def test_the_changes_bytes_equal_the_held_rows_join(spark):
    """The bytes per stream of the changes and the keys each table holds among them, from the
    rows each changed key held as `latest_per_key` carries them, equal those a join of the
    changes with the held rows finds, on random candidates."""
    import random

    from iceberg.compaction import dedupe
    from iceberg.compaction.writes import bytes_delta, held_keys

    rnd, rows, seq = random.Random(7), [], iter(range(10**6))

    def row(key: str, op: str, held: bool) -> tuple:
        n = next(seq)
        return (key, "t", rnd.randrange(3), str(n), n, None, op, False, 0, [n], rnd.randrange(100), None, None, held)

    for k in range(60):  # a state row, a tombstone, both (a replayed round) or neither; then new events
        rows += [row(f"k{k}", op, True) for op in ("u", "d") if rnd.random() < 0.4]
        rows += [row(f"k{k}", rnd.choice("cud"), False) for _ in range(rnd.randrange(3))]
    meta = [(c, t) for c, t in META_COLUMNS if c != POSITION_TEXT]  # a candidate's (`dedupe.CANDIDATE_COLUMNS`)
    ddl = ", ".join(f"{c} {t}" for c, t in meta) + ", _after string, _after_types string, _held boolean"
    candidates = spark.createDataFrame(rows, ddl)
    changes = dedupe.resolve(dedupe.latest_per_key(dedupe.rank(candidates, "source"), held=True), None, "source")
    held = candidates.where("_held")
    carried = bytes_delta(changes, None, broadcast=False, carried=True)
    assert carried == bytes_delta(changes, held, broadcast=True) and carried[()]["s"] and carried[()]["t"]
    named = changes.agg(*[held_keys(c).alias(c) for c, _ in dedupe.HELD_COLUMNS]).first()
    changed = held.join(changes.select("_key"), "_key", "left_semi")
    assert sorted(named["_held_s"]) == sorted(r._key for r in changed.where("_op != 'd'").collect())
    assert sorted(named["_held_t"]) == sorted(r._key for r in changed.where("_op = 'd'").collect())
    assert named["_held_s"] and named["_held_t"]  # the draw has each kind

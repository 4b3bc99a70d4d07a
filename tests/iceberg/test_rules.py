"""The retain rule and the compaction planner, table-driven (no Spark, but for the test that
runs the retain table through the Spark column and SQL the job runs)."""

from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import functions as F

from iceberg.compaction.policy import CleanRange, CompactionPolicy, StreamStats, plan
from iceberg.compaction.retain import Fate, fate

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


FATES = [
    ("c", None, Fate.KEEP_ROW),
    ("u", NOW - timedelta(days=9), Fate.KEEP_ROW),
    ("r", None, Fate.KEEP_ROW),
    ("d", NOW + timedelta(seconds=1), Fate.KEEP_TOMBSTONE),
    ("d", None, Fate.KEEP_TOMBSTONE),
    ("d", NOW, Fate.DROP),  # retention is "at least": expired exactly at expires_at
    ("d", NOW - timedelta(hours=1), Fate.DROP),
]


@pytest.mark.parametrize("op,expires_at,expected", FATES)
def test_fate(op, expires_at, expected):
    assert fate(op, expires_at, NOW) is expected


@pytest.mark.spark
def test_the_job_runs_the_same_rule(spark):
    """The table above through the Spark column and the SQL predicate the job runs."""
    from iceberg.compaction.retain import action, purge_predicate

    rows = [(op, e) for op, e, _ in FATES]
    df = spark.createDataFrame(rows, "op string, expires_at timestamp")
    got = df.select(
        action(df.op).alias("a"), df.expires_at.isNotNull().alias("known"), F.expr(purge_predicate(NOW)).alias("purged")
    ).collect()
    for (op, expires_at, expected), r in zip(FATES, got):
        job = Fate.KEEP_ROW if r["a"] == "upsert" else Fate.DROP if r["known"] and r["purged"] else Fate.KEEP_TOMBSTONE
        assert job is expected, (op, expires_at)


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

"""The ordering rule, table-driven: in Python and as the Spark expression the job runs."""

import pytest
from pyspark.sql import functions as F

from connector.core.ordering import Truncate, newest_truncate, order_key

# (a, b, ordering, newer): each side is (position, snapshot, partition, sequence_number)
CASES = [
    (((10,), False, 0, 1), ((5,), False, 0, 2), "source", "a"),  # higher source position wins over log order
    (((10,), False, 0, 1), ((5,), False, 0, 2), "log", "b"),  # log ordering: highest offset wins
    ((None, False, 0, 1), (None, True, 0, 2), "log", "a"),  # log: a snapshot replayed after a change is older
    ((None, True, 0, 1), (None, True, 0, 2), "log", "b"),  # between two snapshot reads the offset decides
    (((5,), True, 0, 9), ((5,), False, 0, 2), "source", "b"),  # snapshot never beats a streamed change at a tie
    (((4,), True, 0, 9), ((5,), False, 0, 2), "source", "b"),  # nor one with a later position
    (((6,), True, 0, 1), ((5,), False, 0, 2), "source", "a"),  # a snapshot with a later position does win
    (((5,), False, 0, 1), ((5,), False, 0, 2), "source", "b"),  # tie: later in the log
    ((None, False, 0, 3), ((1,), False, 0, 2), "source", "b"),  # no position is older than any position
    (((3, 157, 0), False, 0, 1), ((3, 157, 1), False, 0, 0), "source", "b"),  # MySQL row within one event
    (((1, 2), False, 0, 1), ((1, 2, 0), False, 0, 0), "source", "b"),  # shorter prefix is older (like Spark)
]


@pytest.mark.parametrize("a,b,ordering,newer", CASES)
def test_order_key(a, b, ordering, newer):
    ka, kb = order_key(*a, ordering), order_key(*b, ordering)
    assert (ka > kb) == (newer == "a")


@pytest.mark.spark
def test_the_job_orders_changes_by_the_same_rule(spark):
    """The table above through the order struct the compaction job compares candidates by."""
    from iceberg.compaction.dedupe import candidate_order

    rows = [
        (i, side, ordering, list(p) if p else None, snap, part, seq)
        for i, (a, b, ordering, _) in enumerate(CASES)
        for side, (p, snap, part, seq) in (("a", a), ("b", b))
    ]
    df = spark.createDataFrame(
        rows,
        "i int, side string, ordering string, _source_position array<bigint>, _snapshot boolean,"
        " _partition_id int, _sequence_number long",
    )
    order = F.when(F.col("ordering") == "log", candidate_order("log")).otherwise(candidate_order("source"))
    newest = df.groupBy("i").agg(F.max_by("side", order).alias("newer")).orderBy("i").collect()
    assert [r["newer"] for r in newest] == [newer for *_, newer in CASES]


# A truncate on partition 1 at offset 5, enqueued at t=100 us, at source position (50,).
T = Truncate("db.s.things", 1, "5", 5, 100, (50,))


def test_the_newest_truncate_is_the_marker_and_survives_json():
    later_in_time = Truncate("db.s.things", 0, "1", 1, 900, (40,))
    assert newest_truncate([T, None, later_in_time], "source") is T
    assert newest_truncate([T, later_in_time], "log") is later_in_time
    assert Truncate.from_json(T.to_json()) == T
    assert newest_truncate([None], "log") is None

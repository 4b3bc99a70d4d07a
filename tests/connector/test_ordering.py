"""The ordering rule, table-driven (no Spark)."""

import pytest

from connector.core.ordering import Truncate, carry_positions, newest_truncate, older_than_truncate, order_key

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


def test_carry_positions_takes_the_highest_earlier_position():
    assert carry_positions([None, (5,), (3,), None, (9,), None]) == [None, (5,), (3,), (5,), (9,), (9,)]


# A truncate on partition 1 at offset 5, enqueued at t=100 us, at source position (50,).
T = Truncate("db.s.things", 1, "5", 5, 100, (50,))

# (position, snapshot, partition, sequence number, enqueued us, ordering, older)
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


@pytest.mark.parametrize("position,snapshot,partition,seq,us,ordering,older", TRUNCATE_CASES)
def test_older_than_truncate(position, snapshot, partition, seq, us, ordering, older):
    assert older_than_truncate(position, snapshot, "db.s.things", partition, seq, us, T, ordering) is older


def test_the_newest_truncate_is_the_marker_and_survives_json():
    later_in_time = Truncate("db.s.things", 0, "1", 1, 900, (40,))
    assert newest_truncate([T, None, later_in_time], "source") is T
    assert newest_truncate([T, later_in_time], "log") is later_in_time
    assert Truncate.from_json(T.to_json()) == T
    assert newest_truncate([None], "log") is None

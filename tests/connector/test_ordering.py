"""The ordering rule, table-driven (no Spark)."""

import pytest

from connector.ordering import carry_positions, order_key

# (a, b, ordering, newer): each side is (position, snapshot, partition, sequence_number)
CASES = [
    (((10,), False, 0, 1), ((5,), False, 0, 2), "source", "a"),  # higher source position wins over log order
    (((10,), False, 0, 1), ((5,), False, 0, 2), "log", "b"),  # log ordering: highest offset wins
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

"""The packed route of the dedupe (one long per order key, hash aggregation) against the
ordering rule: the pure layout against `connector.core.ordering.order_key`, and on Spark the
packed winners against the general route's window on random candidates."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from connector.core.ordering import order_key
from iceberg.compaction import dedupe
from iceberg.compaction.dedupe import MAX_POSITION, Packing


def bounds_of(positions, partitions, seqs) -> dict:
    sized = [len(p) for p in positions if p is not None]
    b = {
        "size_min": min(sized, default=None),
        "size_max": max(sized, default=None),
        "part_min": min(partitions),
        "part_max": max(partitions),
        "seq_min": min(seqs),
        "seq_max": max(seqs),
    }
    for i in range(MAX_POSITION):
        col = [p[i] for p in positions if p is not None and len(p) > i]
        b[f"lo{i}"], b[f"hi{i}"] = min(col, default=None), max(col, default=None)
    return b


changes = st.integers(1, 3).flatmap(
    lambda n: st.lists(
        st.tuples(
            st.tuples(*[st.integers(-5, 2**12) for _ in range(n)]),
            st.booleans(),
            st.integers(0, 31),
            st.integers(0, 2**16),
        ),
        min_size=2,
        max_size=30,
    )
)


@given(changes)
def test_packed_key_orders_like_the_ordering_rule(cs):
    packing = Packing.of(bounds_of([c[0] for c in cs], [c[2] for c in cs], [c[3] for c in cs]))
    assert packing is not None
    packed = sorted(cs, key=lambda c: packing.pack(c[0], 0 if c[1] else 1, c[2], c[3]))
    ruled = sorted(cs, key=lambda c: order_key(c[0], c[1], c[2], c[3], "source"))
    assert [order_key(c[0], c[1], c[2], c[3], "source") for c in packed] == [
        order_key(c[0], c[1], c[2], c[3], "source") for c in ruled
    ]


@given(changes, st.data())
def test_bounds_of_two_frames_merge_into_the_bounds_of_their_union(cs, data):
    """The job takes the log's bounds and the held rows' bounds in two passes."""
    cut = data.draw(st.integers(1, len(cs) - 1))
    a, b = cs[:cut], cs[cut:]
    of = lambda part: bounds_of([c[0] for c in part], [c[2] for c in part], [c[3] for c in part])  # noqa: E731
    assert dedupe.merge_bounds(of(a), of(b)) == of(cs)


@given(
    st.lists(
        st.tuples(
            st.none() | st.lists(st.integers(-(2**40), 2**40), max_size=MAX_POSITION + 1),
            st.integers(0, 31),
            st.integers(0, 2**40),
        ),
        min_size=1,
        max_size=30,
    )
)
@hsettings(deadline=None)  # the first call loads Arrow's compute kernels
def test_bounds_from_the_planners_arrow_scan_equal_the_model(rows):
    """The job takes the dirty events' bounds from the planner's pyiceberg scan, not from Spark."""
    import pyarrow as pa

    positions, partitions, seqs = zip(*rows)
    got = dedupe.arrow_bounds(
        pa.chunked_array([pa.array(positions, pa.list_(pa.int64()))]),
        pa.array(partitions, pa.int32()),
        pa.array(seqs, pa.int64()),
    )
    assert got == bounds_of(positions, partitions, seqs)


def test_rounds_that_do_not_fit_take_the_general_route():
    assert Packing.of(bounds_of([(1,), (1, 2)], [0], [0])) is None  # () < (1,) < (1, 0): lengths differ
    assert Packing.of(bounds_of([(0,), (2**62,)], [0], [0, 1])) is None  # 63 bits of position alone
    assert Packing.of(bounds_of([(0,), (2**30,)], [0, 7], [0, 2**20])) is not None
    assert Packing.of(bounds_of([None], [-1], [0])) is None


# --- Spark: the packed winners equal the general route's, key by key ----------------------

candidate = st.tuples(
    st.integers(0, 3),  # key
    st.booleans(),  # held (at most one per key is kept)
    st.integers(0, 1),  # partition
    st.one_of(st.none(), st.integers(0, 4)),  # position seed (None: a bare tombstone)
    st.booleans(),  # snapshot
    st.sampled_from(["c", "u", "d"]),
)


def frame(spark, rows, width):
    from pyspark.sql import functions as F

    seqs = {0: itertools.count(), 1: itertools.count()}
    held_keys, out = set(), []
    for key, held, part, pos, snap, op in rows:
        if held and key in held_keys:
            held = False
        held_keys |= {key} if held else set()
        position = None if pos is None else [pos] + [(pos * 7 + i) % 3 for i in range(1, width)]
        snap = snap and (pos is not None or key == 0)  # a position-less snapshot row: key 0 only
        out.append(
            (
                f"k{key}",
                "t",
                part,
                "0",
                next(seqs[part]),
                None,
                "d" if pos is None else op,
                snap,
                0,
                position,
                1,
                None,
                None,
                held,
            )
        )
    schema = (
        "_key string, _topic string, _partition_id int, _offset string, _sequence_number bigint, "
        "_enqueued_time timestamp, _op string, _snapshot boolean, _source_ts bigint, "
        "_source_position array<bigint>, _payload_bytes bigint, _after string, _after_types string, "
        "_held boolean"
    )
    return spark.createDataFrame(out, schema).select(*[F.col(c) for c in dedupe.CANDIDATE_COLUMNS])


@pytest.mark.spark
@pytest.mark.slow
@hsettings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    rows=st.lists(candidate, min_size=1, max_size=14),
    width=st.integers(1, 3),
    ordering=st.sampled_from(["source", "log"]),
)
# a bare tombstone before the key's first position has no position: even a snapshot read wins
@example(rows=[(1, False, 0, None, False, "d"), (1, False, 0, 3, True, "c")], width=1, ordering="source")
# after it, the tombstone takes the position and wins over the snapshot read
@example(rows=[(1, False, 0, 3, True, "c"), (1, False, 0, None, False, "d")], width=2, ordering="source")
def test_packed_winners_equal_the_general_route(spark, rows, width, ordering):
    import numpy as np
    import pyarrow as pa

    from iceberg.compaction.stats import in_order, segment
    from iceberg.compaction.winners import candidate_bounds

    df = frame(spark, rows, width)
    general = {r["_key"]: r for r in dedupe.latest_per_key(dedupe.rank(df, ordering)).collect()}
    packing = Packing.of(df.agg(*candidate_bounds(ordering)).first().asDict())
    assert packing is not None
    packed = {r["_key"]: r for r in dedupe.packed_latest(df, packing, ordering).collect()}
    assert packed.keys() == general.keys()
    rows_ = df.collect()
    own = {(r["_key"], r["_held"], r["_partition_id"], r["_sequence_number"]): r["_source_position"] for r in rows_}
    # the job packs only a round whose streams are in order (the planner's check of the log)
    in_order_ = all(
        in_order(
            [
                segment(
                    np.array([r["_sequence_number"] for r in new]),
                    pa.array([r["_source_position"] for r in new], pa.list_(pa.int64())),
                    np.array([r["_snapshot"] for r in new]),
                    ordering,
                )
            ]
        )
        for part in (0, 1)
        if (new := [r for r in rows_ if not r["_held"] and r["_partition_id"] == part])
    )
    for key, g in general.items():
        p = packed[key]
        if p["_irregular"]:
            continue  # settled by the general route
        if in_order_:
            assert g["_stale"] == 0, f"{key}: stale events on a key the packed route settles"
        winner = (p["_win_held"], p["_partition_id"], p["_sequence_number"])
        assert winner == (g["_held"], g["_partition_id"], g["_sequence_number"]), key
        assert p["_id"] == packing.log_key(p["_partition_id"], p["_sequence_number"]), key
        if ordering == "source":  # unpacked from the order key (under "log" the job reads the log's)
            assert p["_position"] == g["_source_position"], key
        else:
            assert p["_position"] is None and own[(key, *winner)] == g["_source_position"], key

"""The planner's statistics (no Spark): read a few log files at a time, they are the figures
of the whole dirty range read at once."""

from __future__ import annotations

import json
from datetime import timedelta

import pyarrow as pa
import pytest

from connector.app import policy_of
from iceberg.catalog import load_catalog
from iceberg.compaction.dedupe import arrow_bounds
from iceberg.compaction.stats import stream_stats
from iceberg.summary_keys import CLEANER_POINTS, STREAM_BYTES
from tests.conftest import kcat_lines
from tests.iceberg.helpers import NOW, names, run_ingest, with_source, write_lines

TOPIC = "db.s.things"
LAG = timedelta(milliseconds=100)


def _pg(op: str, key: int, lsn: int) -> str:
    return json.dumps(
        {
            "op": op,
            "before": None,
            "after": None if op in "dt" else {"id": key, "v": lsn},
            "source": {"connector": "postgresql", "table": "things", "lsn": lsn},
        }
    )


def _stream(part: int, n: int, ts0: int) -> list[str]:
    values = [_pg("t" if i % 50 == 7 else "u", i % 20, 10_000 + 10 * i + part) for i in range(n)]
    keys = [None if i % 50 == 7 else {"id": i % 20} for i in range(n)]
    return kcat_lines(TOPIC, values, keys, partition=part, ts0=ts0)


def _expected(rows: list[dict], points: dict[str, int], cutoff, ordering: str) -> dict[str, tuple]:
    """Per stream, what the planner reports, computed row by row over the whole log."""
    out = {}
    for stream in sorted({f"{r['topic']}:{r['partition']}" for r in rows}):
        point = points.get(stream, 0)
        mine = [r for r in rows if f"{r['topic']}:{r['partition']}" == stream and r["sequence_number"] >= point]
        young = [r["sequence_number"] for r in mine if r["enqueued_time"] > cutoff]
        end = min(young) if young else max(r["sequence_number"] for r in mine) + 1
        cleanable = [r for r in mine if r["sequence_number"] < end]
        events = [r for r in cleanable if r["op"] != "t"]
        position = pa.array(
            [r["source_position"] if ordering == "source" else None for r in events], pa.large_list(pa.int64())
        )
        bounds = arrow_bounds(
            position,
            pa.array([r["partition"] for r in events], pa.int32()),
            pa.array([r["sequence_number"] for r in events], pa.int64()),
        )
        out[stream] = (
            point,
            end,
            sum(r["payload_bytes"] for r in mine),
            sum(r["payload_bytes"] for r in cleanable),
            len(mine),
            len(cleanable),
            min(r["enqueued_time"] for r in mine),
            len(cleanable) - len(events),
            bounds,
        )
    return out


@pytest.mark.spark
def test_stream_stats_read_a_few_files_at_a_time_match_the_whole_range(settings, tmp_path):
    now_ms = int(NOW.timestamp() * 1000)
    # partition 0 turns young (within min_compaction_lag of NOW) after 150 events, partition 1
    # stays old, partition 2 is young from its 60th event; interleaved, so every log file
    # holds all three
    streams = [_stream(0, 240, now_ms - 250), _stream(1, 240, now_ms - 10_000), _stream(2, 240, now_ms - 160)]
    lines = [s[i] for i in range(240) for s in streams]
    s = with_source(settings, write_lines(tmp_path / "in.jsonl", lines), min_compaction_lag_seconds=LAG.total_seconds())
    s = s.model_copy(update={"source": s.source.model_copy(update={"batch_size": 100})})
    run_ingest(s)
    t = names(s, "things")
    catalog = load_catalog(s)
    log = catalog.load_table(t.log)
    # the cleaner points live in the state table's snapshot, its rows give the clean bytes
    points = {f"{TOPIC}:1": 40, f"{TOPIC}:2": 30}
    state = catalog.create_table(
        t.state,
        schema=pa.schema([("_topic", pa.string()), ("_partition_id", pa.int32()), ("_payload_bytes", pa.int64())]),
    )
    state.append(
        pa.table({"_topic": [TOPIC], "_partition_id": [1], "_payload_bytes": [77]}, schema=state.schema().as_arrow()),
        snapshot_properties=CLEANER_POINTS.entry(points),
    )
    policy = policy_of(s)
    assert policy.min_compaction_lag == LAG

    expected = _expected(log.scan().to_arrow().to_pylist(), points, NOW - LAG, policy.ordering)
    files = len(list(log.scan().plan_files()))
    assert files >= 7, "the test needs a log of several files"
    for chunk_rows in (1, 250, 10_000_000):  # a file, a few files, all files per chunk
        got = stream_stats(catalog, t, policy, NOW, bounds=True, chunk_rows=chunk_rows)
        assert {
            g.stream: (
                g.cleaner_point,
                g.cleanable_end,
                g.dirty_bytes,
                g.cleanable_bytes,
                g.dirty_events,
                g.cleanable_events,
                g.first_dirty_time,
                g.truncates,
                g.bounds,
            )
            for g in got
        } == expected
        assert {g.stream: g.clean_bytes for g in got} == {f"{TOPIC}:0": 0, f"{TOPIC}:1": 77, f"{TOPIC}:2": 0}
        # every stream comes in order, however its files are listed and chunked (the packed route)
        assert all(g.monotone for g in got), chunk_rows
    # a state whose commits record the bytes they hold is not read for them: the record counts
    # (1000 where its rows hold 23)
    recorded = {f"{TOPIC}:1": 77, f"{TOPIC}:2": 1000}
    state.append(
        pa.table({"_topic": [TOPIC], "_partition_id": [2], "_payload_bytes": [23]}, schema=state.schema().as_arrow()),
        snapshot_properties={**CLEANER_POINTS.entry(points), **STREAM_BYTES.entry(recorded)},
    )
    got = stream_stats(catalog, t, policy, NOW)
    assert {g.stream: g.clean_bytes for g in got} == {f"{TOPIC}:0": 0, **recorded}
    # what the test exercises: young events end two ranges early, truncates are counted
    assert [v[1] for v in expected.values()] == [151, 240, 61]
    assert all(v[7] for v in expected.values())


def _seg(seqs, positions, snapshots=None, ordering="source"):
    import numpy as np

    from iceberg.compaction.stats import segment

    snaps = np.array(snapshots if snapshots is not None else [False] * len(seqs))
    return segment(
        np.array(seqs), pa.array([None if p is None else [p] for p in positions], pa.list_(pa.int64())), snaps, ordering
    )


@pytest.mark.parametrize(
    "parts,ordered",
    [
        ([([0, 1, 2], [5, 6, 7])], True),
        ([([2, 0, 1], [7, 5, 6])], True),  # read in any order, judged in sequence-number order
        ([([0, 1, 2], [5, 3, 7])], False),  # lsn 3 arrives after lsn 5
        ([([0, 1, 2], [5, None, 6])], True),  # a bare tombstone carries lsn 5
        ([([0, 1], [None, None])], True),  # bare tombstones only
        ([([0, 1], [5, 6]), ([2, 3], [7, 8])], True),
        ([([2, 3], [7, 8]), ([0, 1], [5, 9])], False),  # across chunks: 9 then 7
        ([([0, 1], [5, 6]), ([1, 2], [7, 8])], False),  # overlapping chunks: not known, so no
        ([([0, 1], [5, 6]), ([2, 3], [None, 6])], True),  # a leading bare tombstone carries the chunk before's 6
    ],
)
def test_segments_say_whether_a_stream_is_in_order(parts, ordered):
    from iceberg.compaction.stats import in_order

    assert in_order([_seg(s, p) for s, p in parts]) is ordered


def test_a_snapshot_read_after_a_streamed_change_at_its_position_is_out_of_order():
    from iceberg.compaction.stats import in_order

    assert not in_order([_seg([0, 1], [5, 5], [False, True])])
    assert in_order([_seg([0, 1], [5, 5], [True, False])])
    # after a bare tombstone (rank 1, carried 5), across chunks
    assert not in_order([_seg([0, 1], [5, None], [True, False]), _seg([2], [5], [True])])
    # under log only the rank counts: a snapshot read after a streamed change
    assert not in_order([_seg([0, 1], [9, 1], [False, True], "log")])
    assert in_order([_seg([0, 1], [9, 1], [True, False], "log")])
    # positions of two lengths: unknown, so not in order (such a round does not pack anyway)
    import numpy as np

    from iceberg.compaction.stats import segment

    mixed = segment(np.array([0, 1]), pa.array([[1], [1, 2]], pa.list_(pa.int64())), np.array([False, False]), "source")
    assert mixed is None and not in_order([mixed])

"""Random streams, ingested in random batch splits with compactions in between, end with
the state and tombstones of the plain-Python model of the contract (tests/model.py)."""

from __future__ import annotations

import itertools
import json
import tempfile
from datetime import timedelta
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from connector.app import run_compaction
from iceberg.catalog import load_catalog
from iceberg.compaction import job
from iceberg.compaction.stats import load_optional
from iceberg.maintenance import MaintenancePolicy
from tests.iceberg.helpers import (
    NOW,
    assert_recorded_bytes_are_held,
    assert_usage_told_by_metadata,
    compact_table,
    decoded,
    names,
    offsets_by_key,
    run_ingest,
    with_source,
    write_lines,
)
from tests.model import expected_tables, stale_events, survivors

pytestmark = pytest.mark.spark
_ns = itertools.count()
EAGER = MaintenancePolicy(snapshot_retention=timedelta(0), rewrite_files=1, expire_batch=1)

event = st.tuples(
    st.integers(0, 3),  # key; its partition is key % 2, as a partitioner would place it
    # t: a truncate (partition 2); again: the key's last change delivered once more
    st.sampled_from(["c", "u", "u", "d", "r", "c", "u", "d", "t", "junk", "again"]),
    st.integers(1, 8),  # source position (lsn): collisions and stale events on purpose
    st.booleans(),  # a delete is followed by its bare tombstone
)


def to_lines(stream, ordering: str, table: str = "things") -> list[str]:
    """kcat lines. A truncate's position is above every one before it and below every one
    after it (no event arrives after a truncate it is older than: which round such an event
    lands in changes what it can still delete, see docs/semantics.md). `junk`: a create
    whose record key is not JSON (a dead letter). `again`: the key's last change once more, at
    a new offset (under source a truncate in between makes it a change of its own: as a
    re-delivery it would be older than the truncate)."""
    offsets = [0, 0, 0]
    lines = []
    base = 0
    last: dict[int, tuple] = {}
    for key, op, lsn, tombstone in stream:
        if op == "again":
            key, op, lsn, tombstone = last.get(key, (key, "u", lsn, tombstone))
        elif op not in ("t", "junk"):  # a dead letter is not delivered again
            last[key] = (key, op, lsn, tombstone)
        if op == "t" and ordering == "source":
            last.clear()
        part = 2 if op == "t" else key % 2
        if op == "t":
            base += 9
        position = base if op == "t" else base + lsn
        source = {
            "connector": "postgresql",
            "table": table,
            "lsn": position,
            "snapshot": "true" if op == "r" else "false",
        }
        kind = "c" if op == "junk" else op
        values = [
            json.dumps(
                {
                    "op": kind,
                    "before": None,
                    "after": None if kind in "dt" else {"id": key, "lsn": lsn},
                    "source": source,
                }
            )
        ]
        if op == "d" and tombstone:
            values.append(None)
        raw_key = None if op == "t" else f"id={key}" if op == "junk" else json.dumps({"id": key})
        for v in values:
            lines.append(
                json.dumps(
                    {
                        "topic": f"db.s.{table}",
                        "partition": part,
                        "offset": offsets[part],
                        "ts": 1_700_000_000_000 + len(lines),
                        "key": raw_key,
                        "payload": v,
                    }
                )
            )
            offsets[part] += 1
    return lines


@hsettings(
    max_examples=16,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    stream=st.lists(event, min_size=1, max_size=25),
    cuts=st.lists(st.integers(1, 40), max_size=2),
    ordering=st.sampled_from(["source", "log"]),
    packed=st.booleans(),
    maintain=st.booleans(),
    merged=st.booleans(),
    alone=st.booleans(),
)
# a delete and its bare tombstone in one round: the tombstone wins and carries the delete's position
@example(
    stream=[(0, "c", 1, False), (0, "d", 2, True)],
    cuts=[],
    ordering="source",
    packed=True,
    maintain=False,
    merged=False,
    alone=False,
)
# a truncate after a delete (defect of earlier versions): the tombstone keeps the delete's own metadata
@example(
    stream=[(0, "c", 1, False), (1, "c", 1, False), (1, "d", 2, True), (0, "t", 1, False)],
    cuts=[],
    ordering="source",
    packed=True,
    maintain=False,
    merged=False,
    alone=False,
)
# under log, a truncate compares enqueued times across partitions, not offsets
@example(
    stream=[(0, "c", 1, False), (1, "c", 1, False), (0, "t", 1, False), (0, "c", 1, False)],
    cuts=[2],
    ordering="log",
    packed=True,
    maintain=False,
    merged=False,
    alone=False,
)
# stale events within one round, and a snapshot replayed after a streamed change under log
@example(
    stream=[(0, "c", 5, False), (0, "u", 3, False), (0, "u", 7, False), (1, "u", 2, False), (1, "r", 1, False)],
    cuts=[],
    ordering="log",
    packed=True,
    maintain=False,
    merged=False,
    alone=False,
)
@example(
    stream=[(0, "c", 5, False), (0, "u", 3, False), (0, "u", 7, False), (0, "r", 7, False)],
    cuts=[2],
    ordering="source",
    packed=True,
    maintain=False,
    merged=False,
    alone=False,
)
# under log, a streamed change, a truncate after it, then a snapshot row of the key: the
# truncate removes the change and the snapshot row is the key's (in one round or two)
@example(
    stream=[(0, "u", 3, False), (1, "t", 1, False), (0, "r", 1, False)],
    cuts=[],
    ordering="log",
    packed=True,
    maintain=False,
    merged=False,
    alone=False,
)
@example(
    stream=[(0, "u", 3, False), (1, "t", 1, False), (0, "r", 1, False)],
    cuts=[2],
    ordering="log",
    packed=True,
    maintain=False,
    merged=False,
    alone=False,
)
# under log, two truncates in one round: a snapshot row between them is no stale event;
# a delete before both keeps guarding after them; a re-delivered change after both
@example(
    stream=[
        (0, "u", 3, False),
        (1, "d", 2, True),
        (0, "t", 1, False),
        (0, "r", 1, False),
        (1, "r", 1, False),
        (0, "t", 1, False),
        (0, "again", 1, False),
    ],
    cuts=[],
    ordering="log",
    packed=True,
    maintain=False,
    merged=False,
    alone=False,
)
def test_random_stream_in_random_batches_matches_the_model(
    spark, settings, stream, cuts, ordering, packed, maintain, merged, alone
):
    """`packed`: the packed order key wherever a round fits (as in production for rounds of
    more than `small_round` events), else the general route (the window) for every round,
    with the events' payload carried through it (as in production for small rounds).
    `maintain`: after every round, a table with more than one data file is rewritten and
    every snapshot that may go is expired (later rounds find their cleaner points after
    that). `merged`: such a large round MERGEs into tables holding rows (as one of more than
    `DELTA_ROUND` events does), else it writes through Iceberg's API. `alone`: a small round
    reads its own rows by Spark's scans (as one does whose state is too large to read in the
    driver's JVM), else as a group of one, read there (as a small table's in production)."""
    from iceberg.compaction import shared

    lines = to_lines(stream, ordering)
    path = write_lines(Path(tempfile.mkdtemp()) / "in.jsonl", lines)
    s = with_source(
        settings.model_copy(
            update={
                "catalog": settings.catalog.model_copy(
                    update={"namespace": f"{settings.catalog.namespace}_p{next(_ns)}"}
                )
            }
        ),
        path,
        ordering=ordering,
    )
    bounds = sorted({c for c in cuts if c < len(lines)}) + [len(lines)]
    stale = 0
    for b in bounds:
        ingest_up_to(s, lines, b)
        if not load_catalog(s).table_exists(names(s, "things").log):
            continue  # only dead letters so far
        assert_usage_told_by_metadata(s, "things", compacted=False)
        with (
            mock.patch.object(job, "DELTA_ROUND", -1 if merged else job.DELTA_ROUND),
            mock.patch.object(shared, "JVM_ROWS", -1 if alone else shared.JVM_ROWS),
            mock.patch.object(shared, "read_together", wraps=shared.read_together) as together,
        ):
            report = compact_table(spark, s, "things", packed=packed, maintenance=EAGER if maintain else None)
        # the route taken: a group of one wherever the round is small, has no truncate and is not alone
        truncated = any('"op": "t"' in (json.loads(x)["payload"] or "") for x in lines[:b])  # this round's or a marker
        assert together.called == (bool(report.events) and not (packed or alone or truncated)), (report, together)
        assert not [a for a in report.maintenance if a.startswith("failed")], report.maintenance  # best effort: logged
        stale += report.stale
        assert_recorded_bytes_are_held(s, "things")
        assert_usage_told_by_metadata(s, "things", compacted=True)
    events = decoded(path, s)
    assert sum(1 for e in events if getattr(e, "reason", None) == "key") == sum(1 for x in stream if x[1] == "junk")
    assert stale == assert_matches_model(s, "things", events, bounds, ordering)


def ingest_up_to(s, lines: list[str], bound: int) -> None:
    """Ingests `lines` up to `bound` (the earlier ones are held, and skipped): exactly the
    lines the model's round ends at `bound`, whatever ranges the file source reads them in."""
    run_ingest(with_source(s, write_lines(Path(tempfile.mkdtemp()) / "upto.jsonl", lines[:bound])))


def assert_matches_model(s, table: str, events: list, bounds: list[int], ordering: str) -> int:
    """`table`'s state, tombstones, stored positions and stale events are the model's for the
    decoded `events` (of every table) ingested up to each of `bounds` and compacted after
    each; returns how many stale events the model finds."""
    events = [e if getattr(e, "table", table) == table else None for e in events]
    mine = [e for e in events if e is not None]
    state, tombs = expected_tables(mine, ordering)
    assert offsets_by_key(s, names(s, table).state) == state
    assert offsets_by_key(s, names(s, table).tombstones) == tombs
    # the stored source positions too: a later round compares new events with them
    catalog, t = load_catalog(s), names(s, table)
    stored = {
        r["_key"]: (None if r["_source_position"] is None else tuple(r["_source_position"]))
        for name in (t.state, t.tombstones)
        if catalog.table_exists(name)
        for r in catalog.load_table(name).scan(selected_fields=("_key", "_source_position")).to_arrow().to_pylist()
    }
    assert stored == {k: position for k, (_, _, position) in survivors(mine, ordering).items()}
    # every stale event, with its reason, for the rounds as they were split
    rounds = [[e for e in events[a:b] if e is not None] for a, b in zip([0] + bounds, bounds)]
    want = stale_events(rounds, ordering)
    stale_table = load_optional(catalog, t.stale)
    got = (
        []
        if stale_table is None
        else stale_table.scan(selected_fields=("_partition_id", "_sequence_number", "reason")).to_arrow().to_pylist()
    )
    assert sorted((r["_partition_id"], r["_sequence_number"], r["reason"]) for r in got) == want
    return len(want)


@hsettings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    streams=st.lists(st.lists(event, min_size=1, max_size=12), min_size=2, max_size=4),
    cuts=st.lists(st.integers(1, 50), max_size=3),
    ordering=st.sampled_from(["source", "log"]),
    in_jvm=st.booleans(),
    compiled=st.booleans(),
)
# small rounds read in the driver's JVM and used as local relations (`shared.LOCAL_EVENTS`),
# into rows held from the round before, with a delete and its bare tombstone
@example(
    streams=[[(0, "c", 1, False), (1, "u", 2, False)], [(2, "c", 1, False), (2, "d", 2, True), (3, "u", 3, False)]],
    cuts=[2, 4],
    ordering="source",
    in_jvm=True,
    compiled=False,
)
def test_tables_compacted_at_once_each_match_the_model(spark, settings, streams, cuts, ordering, in_jvm, compiled):
    """Several tables' streams, one after another in one source, ingested in random splits;
    after each ingest one pass compacts every table, rounds running at once, their tables read
    together by Spark's scans or in the driver's JVM (`in_jvm`), as a large shared read
    (`compiled`: its queries' code compiled, the chunks read in the JVM checkpointed) or a
    small one: each table ends with the model's tables for its own events."""
    from iceberg.compaction import shared

    tables = [f"things{i}" for i in range(len(streams))]
    lines = [line for table, stream in zip(tables, streams) for line in to_lines(stream, ordering, table)]
    path = write_lines(Path(tempfile.mkdtemp()) / "in.jsonl", lines)
    ns = f"{settings.catalog.namespace}_m{next(_ns)}"
    s = with_source(
        settings.model_copy(update={"catalog": settings.catalog.model_copy(update={"namespace": ns})}), path
    )
    s = s.model_copy(
        update={"compaction": s.compaction.model_copy(update={"ordering": ordering, "parallel_tables": len(tables)})}
    )
    bounds = sorted({c for c in cuts if c < len(lines)}) + [len(lines)]
    with (
        mock.patch.object(shared, "JVM_ROWS", shared.JVM_ROWS if in_jvm else -1),
        mock.patch.object(shared, "COMPILED_EVENTS", -1 if compiled else shared.COMPILED_EVENTS),
        mock.patch.object(shared, "LOCAL_EVENTS", -1 if compiled else shared.LOCAL_EVENTS),
        mock.patch.object(shared, "read_together", wraps=shared.read_together) as read_together,
        mock.patch.object(shared.compat_spark, "jvm_reads", wraps=shared.compat_spark.jvm_reads) as jvm_reads,
        mock.patch.object(shared.log, "warning", wraps=shared.log.warning) as warned,
    ):
        for b in bounds:
            ingest_up_to(s, lines, b)
            run_compaction(s, force=True, now=NOW)
            for table in tables:
                if load_catalog(s).table_exists(names(s, table).log):
                    assert_usage_told_by_metadata(s, table, compacted=True)
    failed = [c for c in warned.call_args_list if "failed" in c.args[0]]
    assert not failed, failed  # no shared read failed (its rounds would each read alone)
    assert jvm_reads.called == (in_jvm and read_together.called)
    events = decoded(path, s)
    for table in tables:
        if load_catalog(s).table_exists(names(s, table).log):
            assert_matches_model(s, table, events, bounds, ordering)
            assert_recorded_bytes_are_held(s, table)

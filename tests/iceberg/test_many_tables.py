"""A pass over many tables: a quiet table costs no round (its commits' metadata says so), and a
table whose round fails stops neither the others nor itself on the next pass."""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from connector.app import RoundsFailed, run_compaction, table_policy
from iceberg import leases
from iceberg.catalog import load_catalog
from iceberg.compaction.policy import plan
from iceberg.compaction.quiet import backlog, quiet
from iceberg.compaction.retention import may_be_older
from iceberg.compaction.stats import stream_stats
from iceberg.maintenance import MaintenancePolicy, Upkeep, maintain
from iceberg.summary_keys import APPENDED, MARKERS
from tests.iceberg.helpers import NOW, decoded, names, run_ingest, with_source, write_lines
from tests.iceberg.test_property import assert_matches_model, to_lines

pytestmark = pytest.mark.spark

# (key, op, lsn, tombstone) as the property test's streams
STREAM = [(0, "c", 1, False), (1, "c", 2, False), (1, "d", 3, True), (0, "u", 4, False), (2, "c", 5, False)]


def _lake(settings, tables: list[str], tag: str, stream=STREAM):
    lines = [line for t in tables for line in to_lines(stream, "source", t)]
    path = write_lines(Path(tempfile.mkdtemp()) / "in.jsonl", lines)
    catalog = settings.catalog.model_copy(update={"namespace": f"{settings.catalog.namespace}_{tag}"})
    s = with_source(settings.model_copy(update={"catalog": catalog}), path)
    return s.model_copy(update={"compaction": s.compaction.model_copy(update={"parallel_tables": 3})}), path


def test_a_pass_starts_the_table_with_the_most_rows_appended_first(spark, settings):
    """The backlog, from the log's commits, is every line ingested since the last round; the
    busier table's round starts first, the table named first waits."""
    lines = {"b0": to_lines(STREAM[:2], "source", "b0"), "b1": to_lines(STREAM, "source", "b1")}
    path = write_lines(Path(tempfile.mkdtemp()) / "in.jsonl", lines["b0"] + lines["b1"])
    catalog = settings.catalog.model_copy(update={"namespace": f"{settings.catalog.namespace}_busy"})
    s = with_source(settings.model_copy(update={"catalog": catalog}), path)
    s = s.model_copy(update={"compaction": s.compaction.model_copy(update={"parallel_tables": 1})})
    run_ingest(s)
    catalog = load_catalog(s)
    assert {t: backlog(catalog, names(s, t)) for t in lines} == {t: len(v) for t, v in lines.items()}
    started: list[str] = []
    run_compaction(s, force=True, now=NOW, on_table=started.append)
    assert started == [names(s, "b1").state, names(s, "b0").state]
    assert {t: backlog(catalog, names(s, t)) for t in lines} == {"b0": 0, "b1": 0}


def test_each_ingest_commit_records_what_it_appends_per_stream(spark, settings):
    """APPENDED against the rows the log and the dead letters hold: per stream first and end
    sequence number, rows, payload bytes, oldest and newest enqueued time; and the retention's
    walk over those commits (`may_be_older`): every row or none older than a cut-off."""
    s, path = _lake(settings, ["r0"], "record")
    last = json.loads(path.read_text().splitlines()[-1])
    bad = {**last, "offset": last["offset"] + 1, "ts": last["ts"] + 1, "payload": "{not json"}
    path.write_text(path.read_text() + json.dumps(bad) + "\n")  # a dead letter
    run_ingest(s)
    catalog = load_catalog(s)
    for name in (names(s, "r0").log, names(s, "r0").dead_letters):
        table = catalog.load_table(name)
        rows = table.scan().to_arrow().to_pylist()
        want: dict[str, list[int]] = {}
        for r in rows:
            stream, seq = f"{r['topic']}:{r['partition']}", r["sequence_number"]
            us = int(r["enqueued_time"].timestamp() * 1_000_000)
            first, end, n, size, oldest, newest = want.get(stream, [seq, seq + 1, 0, 0, us, us])
            want[stream] = [
                min(first, seq),
                max(end, seq + 1),
                n + 1,
                size + r.get("payload_bytes", 0),  # a dead letter counts none
                min(oldest, us),
                max(newest, us),
            ]
        assert rows and APPENDED.of(table.current_snapshot()) == want, name
        times = [r["enqueued_time"] for r in rows]
        assert may_be_older(table, min(times)) == 0
        assert may_be_older(table, max(times) + timedelta(seconds=1)) == len(rows)


def test_a_table_whose_dirty_events_are_not_due_costs_no_round(spark, settings):
    """Events the planner would not compact yet (too few, too young) cost no round, told from
    the log commits' records; the planner over the log's rows (`stream_stats`) agrees on each
    setting, and a forced pass, an old enough event or a lower ratio makes the round run."""
    stream = [(k, "c", k + 1, False) for k in range(20)] + [(0, "u", 21, False), (1, "u", 22, False)]
    s, path = _lake(settings, ["n0"], "notdue", stream + [(2, "u", 23, False)])
    s = s.model_copy(update={"compaction": s.compaction.model_copy(update={"min_cleanable_dirty_ratio": 0.5})})
    then = datetime.fromtimestamp(1_700_000_000, UTC) + timedelta(hours=1)  # an hour after the events
    run_ingest(s, max_records=20)
    assert [r.ran for r in run_compaction(s, force=True, now=then)] == [True]
    run_ingest(s, max_records=2)
    run_ingest(s)  # three commits of one or two events
    catalog, t = load_catalog(s), names(s, "n0")
    base = table_policy(s, "n0")

    def both(policy, now=then) -> tuple[bool, bool]:
        """(the metadata says quiet, the planner over the rows plans nothing)"""
        return quiet(catalog, t, policy, now), not plan(stream_stats(catalog, t, policy, now), policy, now)

    assert both(base) == (True, True)  # 3 dirty events against 20 clean: below the ratio
    young = dataclasses.replace(base, min_cleanable_dirty_ratio=0.0, min_compaction_lag=timedelta(days=1))
    assert both(young) == (True, True)
    assert both(dataclasses.replace(base, min_cleanable_dirty_ratio=0.0)) == (False, False)
    assert both(dataclasses.replace(base, max_compaction_lag=timedelta(minutes=30))) == (False, False)
    assert not quiet(catalog, t, base, then, force=True)
    assert [r.ran for r in run_compaction(s, now=then)] == [False]
    # the log's snapshots expire, the one the round planned against with them: the walk runs
    # out of history, so a round decides, and records the log's snapshot and what is dirty
    expire = MaintenancePolicy(snapshot_retention=timedelta(0), expire_batch=1)
    maintain(spark, catalog, t.catalog, [Upkeep(t.log, MARKERS["log"], append_only=True)], expire)
    assert not quiet(catalog, t, base, then)
    assert [(r.ran, r.events) for r in run_compaction(s, now=then)] == [(True, 0)]
    assert both(base) == (True, True)
    assert [r.ran for r in run_compaction(s, now=then)] == [False]
    assert [r.ran for r in run_compaction(s, force=True, now=then)] == [True]
    events = decoded(path, s)
    assert_matches_model(s, "n0", events, [20, len(events)], "source")


def test_a_table_left_dirty_by_young_events_is_decided_from_its_commits(spark, settings):
    """A round that leaves young events dirty records no log snapshot (`cdclake.log-seen`):
    the walk back through the log's commits ends at the commit before which every row is
    compacted, and the metadata agrees with the planner over the rows."""
    stream = [(k, "c", k + 1, False) for k in range(20)] + [(0, "u", 21, False), (1, "u", 22, False)]
    s, path = _lake(settings, ["y1"], "youngtail", stream)
    setting = {"min_cleanable_dirty_ratio": 0.5, "min_compaction_lag_seconds": 3600}
    s = s.model_copy(update={"compaction": s.compaction.model_copy(update=setting)})
    run_ingest(s, max_records=20)
    run_ingest(s)  # a commit of its own for the two updates
    # the lines are enqueued a millisecond apart from 1_700_000_000_000: the last two are young
    now = datetime.fromtimestamp(1_700_000_000.0195, UTC) + timedelta(hours=1)
    (first,) = run_compaction(s, force=True, now=now)
    assert first.ran and first.events == 20
    catalog, t = load_catalog(s), names(s, "y1")
    base = table_policy(s, "y1")

    def both(policy) -> tuple[bool, bool]:
        return quiet(catalog, t, policy, now), not plan(stream_stats(catalog, t, policy, now), policy, now)

    assert both(base) == (True, True)  # young
    assert both(dataclasses.replace(base, min_compaction_lag=timedelta(0))) == (True, True)  # 2 of 22: below 0.5
    old_enough = dataclasses.replace(base, min_compaction_lag=timedelta(0), min_cleanable_dirty_ratio=0.0)
    assert both(old_enough) == (False, False)


def test_an_idle_table_records_the_runs_positions_at_most_every_interval(spark, settings, monkeypatch):
    """A table that received nothing in a pass records the run's positions only once its
    newest commit is `POSITIONS_EVERY_S` old; what a restart re-reads meanwhile is skipped as
    held (the logs keep each line once)."""
    from connector import pipeline
    from iceberg.log_writer import committed_positions

    more = [(2, "c", 6, False), (3, "c", 7, False)]
    hot, idle = to_lines(STREAM + more, "source", "p0"), to_lines(STREAM, "source", "p1")
    first = len(to_lines(STREAM, "source", "p0"))
    path = write_lines(Path(tempfile.mkdtemp()) / "in.jsonl", hot[:first] + idle)
    catalog = settings.catalog.model_copy(update={"namespace": f"{settings.catalog.namespace}_idle"})
    s = with_source(settings.model_copy(update={"catalog": catalog}), path)
    run_ingest(s)
    catalog = load_catalog(s)

    def positions(t: str) -> dict[str, int]:
        return committed_positions(catalog.load_table(names(s, t).log))

    before = positions("p1")
    write_lines(path, hot[:first] + idle + hot[first:])  # two more lines of p0 only
    run_ingest(s)
    assert positions("p1") == before != positions("p0")  # p1 committed a moment ago: no record
    again = run_ingest(s)  # resumes from p1's positions: p0's two lines again, held
    assert (again.records, again.duplicates, sum(again.accepted.values())) == (2, 2, 0)
    monkeypatch.setattr(pipeline, "POSITIONS_EVERY_S", 0.0)
    run_ingest(s)
    assert positions("p1") == positions("p0")
    for t, lines in (("p0", hot), ("p1", idle)):
        assert catalog.load_table(names(s, t).log).scan().to_arrow().num_rows == len(lines)


def test_a_table_quiet_by_its_metadata_costs_no_round(spark, settings):
    s, path = _lake(settings, ["q0", "q1"], "quiet")
    run_ingest(s)
    catalog = load_catalog(s)
    assert not any(quiet(catalog, names(s, t), table_policy(s, t), NOW) for t in ("q0", "q1"))  # never compacted
    assert [r.ran for r in run_compaction(s, force=True, now=NOW)] == [True, True]
    # freshness: now less the enqueued time of the newest event compacted (the stream's last line)
    newest = max(json.loads(line)["ts"] for line in to_lines(STREAM, "source", "q0")) / 1000
    freshness = REGISTRY.get_sample_value("cdclake_table_freshness_seconds", {"table": "q0"})
    assert freshness is not None and abs(freshness - (time.time() - newest)) < 5
    assert all(quiet(catalog, names(s, t), table_policy(s, t), NOW) for t in ("q0", "q1"))
    # the tombstone of key 1 expires a day after the round: then q0 is not quiet (its purge is due)
    later = NOW + timedelta(days=2)
    assert not quiet(catalog, names(s, "q0"), table_policy(s, "q0"), later)
    # snapshots due to expire
    eager = dataclasses.replace(
        table_policy(s, "q0"),
        maintenance=MaintenancePolicy(snapshot_retention=timedelta(0), rewrite_files=16, expire_batch=1),
    )
    assert not quiet(catalog, names(s, "q0"), eager, NOW)

    # a new event of q1: q1 has a round, q0 none; positions alone (ingest records them on every
    # table) do not wake q0
    more = to_lines([*STREAM, (3, "c", 9, False)], "source", "q1")[-1:]
    write_lines(path, [*path.read_text().splitlines(), *more])
    run_ingest(s)
    assert not quiet(catalog, names(s, "q1"), table_policy(s, "q1"), NOW)
    assert quiet(catalog, names(s, "q0"), table_policy(s, "q0"), NOW)
    assert {r.table: r.ran for r in run_compaction(s, force=True, now=NOW)} == {"q0": False, "q1": True}
    events = decoded(path, s)
    for t in ("q0", "q1"):
        assert_matches_model(s, t, events, [len(events)], "source")


def test_a_pass_at_a_time_without_a_zone_takes_it_as_utc(spark, settings):
    """`run_compaction`'s `now` without a time zone is UTC: the round runs as at that UTC time
    (its tombstone expires a retention after it) and ends as the model."""
    s, path = _lake(settings, ["z0"], "naive")
    run_ingest(s)
    (report,) = run_compaction(s, force=True, now=NOW.replace(tzinfo=None))
    assert report.ran and report.deletes == 1
    tombstones = load_catalog(s).load_table(names(s, "z0").tombstones).scan().to_arrow()
    assert tombstones["expires_at"].to_pylist() == [NOW + timedelta(hours=s.compaction.tombstone_retention_hours)]
    events = decoded(path, s)
    assert_matches_model(s, "z0", events, [len(events)], "source")


def test_a_table_whose_round_fails_stops_neither_the_others_nor_its_next_round(spark, settings):
    tables = ["f0", "f1", "f2"]
    s, path = _lake(settings, tables, "fail")
    run_ingest(s)
    catalog = load_catalog(s)
    held = leases.acquire(catalog, names(s, "f1").state, "compaction")  # another round holds f1's table
    try:
        with pytest.raises(RoundsFailed) as failed:
            run_compaction(s, force=True, now=NOW)
    finally:
        held.release()
    assert [t for t, _ in failed.value.failures] == [names(s, "f1").state]
    assert isinstance(failed.value.failures[0][1], leases.LeaseHeldError)
    assert sorted(r.table for r in failed.value.reports) == ["f0", "f2"]
    events = decoded(path, s)
    bounds = [len(events)]
    for t in ("f0", "f2"):
        assert_matches_model(s, t, events, bounds, "source")
    assert not catalog.table_exists(names(s, "f1").state)  # nothing of f1's round was written

    reports = run_compaction(s, force=True, now=NOW)
    assert {r.table: r.ran for r in reports} == {"f0": False, "f1": True, "f2": False}
    for t in tables:
        assert_matches_model(s, t, events, bounds, "source")


def test_small_rounds_are_read_together_and_a_lost_file_fails_its_table_alone(spark, settings, caplog):
    """Three tables' small rounds are read in one shared job. With the files of one table's
    state lost (its plan reads none of them), that job fails, each round reads alone, and
    only that table's round fails; the files back, the next pass compacts it. Every table
    equals the model."""
    import logging
    import shutil

    tables, first = ["g0", "g1", "g2"], 3  # each table's first three events, then all five
    s, _ = _lake(settings, tables, "together", STREAM[:first])
    run_ingest(s)
    with caplog.at_level(logging.INFO, "iceberg.compaction.job"):
        assert all(r.ran for r in run_compaction(s, force=True, now=NOW))
    assert "shared read of 3 tables' rounds" in caplog.text
    path = write_lines(
        Path(tempfile.mkdtemp()) / "all.jsonl", [x for t in tables for x in to_lines(STREAM, "source", t)]
    )
    s = with_source(s, path)
    run_ingest(s)
    events = decoded(path, s)
    bounds = {
        t: [len(STREAM) * i + first, len(events)] for i, t in enumerate(tables)
    }  # g1's first round: g0's five and its three
    lost = [
        Path(f.file.file_path.removeprefix("file:"))
        for f in load_catalog(s).load_table(names(s, "g1").state).scan().plan_files()
    ]
    for f in lost:
        shutil.move(f, f.with_suffix(".away"))
    caplog.clear()
    try:
        with caplog.at_level(logging.INFO, "iceberg.compaction.job"), pytest.raises(RoundsFailed) as failed:
            run_compaction(s, force=True, now=NOW)
    finally:
        for f in lost:
            shutil.move(f.with_suffix(".away"), f)
    assert "shared read of 3 rounds failed" in caplog.text and "each reads alone" in caplog.text
    assert [t for t, _ in failed.value.failures] == [names(s, "g1").state]
    for t in ("g0", "g2"):
        assert_matches_model(s, t, events, bounds[t], "source")

    reports = run_compaction(s, force=True, now=NOW)
    assert {r.table: r.ran for r in reports} == {"g0": False, "g1": True, "g2": False}
    for t in tables:
        assert_matches_model(s, t, events, bounds[t], "source")


def test_an_interrupted_pass_keeps_no_lease(spark, settings, monkeypatch):
    """A pass stopped after its rounds were planned (each holding its table's lease) leaves
    every lease free: the next pass compacts the tables at once, and each equals the model."""
    from iceberg.compaction import shared

    tables = ["i0", "i1"]
    s, path = _lake(settings, tables, "interrupted")
    run_ingest(s)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(shared, "read_together", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_compaction(s, force=True, now=NOW)
    monkeypatch.undo()
    catalog = load_catalog(s)
    for t in tables:  # LeaseHeldError where a lease was kept
        leases.acquire(catalog, names(s, t).state, "compaction").release()
    assert all(r.ran for r in run_compaction(s, force=True, now=NOW))
    events = decoded(path, s)
    for t in tables:
        assert_matches_model(s, t, events, [len(events)], "source")


def test_a_pass_interrupted_in_a_later_set_or_in_a_rounds_write_keeps_no_lease(spark, settings, monkeypatch):
    """Small rounds are read in sets (two tables a set here). A pass interrupted in its second
    set's read, or in one round's write while the others wait or write, leaves every lease
    free; the next pass compacts every table to the model."""
    from iceberg.compaction import job, shared

    tables = ["p0", "p1", "p2", "p3", "p4"]
    s, path = _lake(settings, tables, "sets")
    run_ingest(s)
    monkeypatch.setattr(shared, "GROUP_TABLES", 2)
    read, finish, calls = shared.read_together, job.Round.finish, []

    def second_interrupted(session, rounds):
        calls.append(len(rounds))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return read(session, rounds)

    def interrupted_in_p1(r):
        if r.names.table == "p1":
            raise KeyboardInterrupt
        return finish(r)

    catalog = load_catalog(s)
    for patch in ((shared, "read_together", second_interrupted), (job.Round, "finish", interrupted_in_p1)):
        monkeypatch.setattr(*patch)
        with pytest.raises(KeyboardInterrupt):
            run_compaction(s, force=True, now=NOW)
        monkeypatch.setattr(shared, "read_together", read)
        monkeypatch.setattr(job.Round, "finish", finish)
        for t in tables:  # LeaseHeldError where a lease was kept
            leases.acquire(catalog, names(s, t).state, "compaction").release()
    run_compaction(s, force=True, now=NOW)  # what the interruptions left
    events = decoded(path, s)
    for t in tables:
        assert_matches_model(s, t, events, [len(events)], "source")


def test_a_table_with_events_left_dirty_is_not_quiet(spark, settings):
    """A round that leaves events dirty (younger than min_compaction_lag) does not make its
    table quiet: a later pass compacts them. After it the table is quiet, though its
    tombstones' files still hold an expired tombstone the MERGE deleted (no rewrite is due for
    so few deleted rows)."""
    s, path = _lake(settings, ["y0"], "young")
    s = s.model_copy(update={"compaction": s.compaction.model_copy(update={"min_compaction_lag_seconds": 3600})})
    run_ingest(s)
    # the lines are enqueued a millisecond apart from 1_700_000_000_000: those after the third are young
    then = datetime.fromtimestamp(1_700_000_000_002 / 1000, UTC) + timedelta(hours=1)
    (first,) = run_compaction(s, force=True, now=then)
    assert 0 < first.events < len(path.read_text().splitlines())
    # what the round left dirty (DIRTY) is still young then, and old enough by NOW
    eager = dataclasses.replace(table_policy(s, "y0"), min_cleanable_dirty_ratio=0.0)
    assert quiet(load_catalog(s), names(s, "y0"), eager, then)
    assert not quiet(load_catalog(s), names(s, "y0"), eager, NOW)
    (second,) = run_compaction(s, force=True, now=NOW)
    assert second.ran and first.events + second.events == len(path.read_text().splitlines())
    assert quiet(load_catalog(s), names(s, "y0"), table_policy(s, "y0"), NOW)
    events = decoded(path, s)
    assert_matches_model(s, "y0", events, [len(events)], "source")


def test_a_rounds_session_takes_the_secrets_set_in_the_job_since_it_started(spark):
    """A catalog configured into the running session (its password among its keys): a round's
    own session gets the value itself, not the `SET` command's redacted text of it."""
    from iceberg.spark import round_session

    key = "spark.sql.catalog.later.password"
    spark.conf.set(key, "hunter2")
    try:
        assert "hunter2" not in str(spark.sql("SET").collect())  # what a copy through SET would give
        with round_session(spark, own=True) as session:
            assert session is not spark and session.conf.get(key) == "hunter2"
    finally:
        spark.conf.unset(key)


def test_a_shared_round_with_a_dead_letter_records_the_bytes_its_tables_hold(spark, settings, caplog):
    """Two tables' small rounds read together; in the second, one table's update of a held
    key is refused (a string where the column is an integer): that key keeps its row, and
    the bytes per stream each table's commits record equal those its rows hold."""
    import logging

    from tests.conftest import kcat_lines
    from tests.iceberg.helpers import assert_recorded_bytes_are_held

    def pg(table: str, key: int, lsn: int, v: object) -> str:
        return json.dumps(
            {"op": "c", "after": {"id": key, "v": v}, "source": {"connector": "postgresql", "table": table, "lsn": lsn}}
        )

    def lines(table: str, values: list[tuple[int, object]]) -> list[str]:
        events = [pg(table, k, 10 + i, v) for i, (k, v) in enumerate(values)]
        return kcat_lines(f"db.s.{table}", events, [{"id": k} for k, _ in values])

    first = {"da": [(1, 5), (2, 6)], "db": [(1, 7)]}
    later = {"da": [(2, "six"), (1, 50)], "db": [(1, 70), (2, 8)]}  # da's key 2: refused
    path = Path(tempfile.mkdtemp()) / "in.jsonl"
    s = with_source(settings, write_lines(path, [x for t, v in first.items() for x in lines(t, v)]))
    run_ingest(s)
    run_compaction(s, force=True, now=NOW)
    write_lines(path, [x for t, v in first.items() for x in lines(t, v + later[t])])
    run_ingest(s)
    with caplog.at_level(logging.INFO, "iceberg.compaction.job"):
        reports = {r.table: r for r in run_compaction(s, force=True, now=NOW)}
    assert "shared read of 2 tables' rounds" in caplog.text
    assert (reports["da"].refused, reports["da"].upserts, reports["db"].upserts) == (1, 1, 2)
    for t in first:
        assert_recorded_bytes_are_held(s, t)

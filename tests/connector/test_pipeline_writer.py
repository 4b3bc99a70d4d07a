"""The ingest job on the shared Spark session, real Iceberg tables on the SQLite catalog:
source offsets and progress follow the commits, and a failure at any step of a batch that
creates and writes several tables loses nothing and adds nothing twice."""

from __future__ import annotations

import json

import pytest

from connector.debezium import Decoder
from connector.pipeline import IngestJob, ingest
from connector.sources.file import FileSource
from iceberg.catalog import load_catalog
from iceberg.log_writer import committed_positions
from tests.conftest import kcat_lines
from tests.iceberg.helpers import write_lines

pytestmark = pytest.mark.spark


class _Recording(FileSource):
    """A file source that notes, at each offset commit, what the log table has committed."""

    def __init__(self, path, catalog, table):
        super().__init__(path)
        self.catalog, self.table, self.seen = catalog, table, []

    def commit(self, last):
        positions = {s: seq + 1 for s, (seq, _) in last.items()}
        self.seen.append((positions, committed_positions(self.catalog.load_table(self.table))))


def test_source_offsets_and_progress_follow_the_iceberg_commits(spark, settings, tmp_path):
    values = [
        json.dumps(
            {
                "op": "c",
                "after": {"id": i},
                "ts_ms": 1,
                "source": {"connector": "postgresql", "table": "things", "lsn": 100 + i},
            }
        )
        for i in range(25)
    ]
    path = write_lines(tmp_path / "dump.jsonl", kcat_lines("db.public.things", values, [{"id": i} for i in range(25)]))
    catalog, ns = load_catalog(settings), settings.catalog.namespace
    source = _Recording(path, catalog, (ns, "things__log"))
    progress = []

    def on_batch(stats):
        rows = catalog.load_table((ns, "things__log")).scan(selected_fields=("offset",)).to_arrow().num_rows
        progress.append((stats.records, stats.accepted["things"], rows))

    stats = ingest(spark, source, IngestJob(catalog, ns, Decoder(), 10, on_batch=on_batch))
    assert stats.records == 25
    assert progress == [(10, 10, 10), (20, 20, 20), (25, 25, 25)]  # each batch reported once it is in the table
    assert [p for p, _ in source.seen] == [{"db.public.things:0": n} for n in (10, 20, 25)]
    assert all(p == held for p, held in source.seen)  # never an offset the log has not committed


def _mixed_lines(n: int = 12) -> list[str]:
    """Records of three tables, one of them only dead letters, across partitions and batches."""
    lines = []
    for i in range(n):
        table = ("alpha", "beta", "gamma")[i % 3]
        value = (
            "{not json"
            if table == "gamma"
            else json.dumps(
                {
                    "op": "c",
                    "after": {"id": i},
                    "ts_ms": 1,
                    "source": {"connector": "postgresql", "table": table, "lsn": 100 + i},
                }
            )
        )
        lines.append(
            json.dumps(
                {
                    "topic": f"db.public.{table}",
                    "partition": i % 2,
                    "offset": i // 2,
                    "ts": 1_700_000_000_000 + i,
                    "key": json.dumps({"id": i}),
                    "payload": value,
                }
            )
        )
    return lines


def _held(catalog, ns) -> list[tuple[str, int, int]]:
    """(topic, partition, sequence number) of every row in every log and dead-letter table."""
    out = []
    for _, name in catalog.list_tables(ns):
        rows = catalog.load_table((ns, name)).scan(selected_fields=("topic", "partition", "sequence_number"))
        out += [(r["topic"], r["partition"], r["sequence_number"]) for r in rows.to_arrow().to_pylist()]
    return sorted(out)


@pytest.mark.parametrize(
    "point",
    [f"ingest.create-table:{n}" for n in (1, 2, 3)]
    + [f"{p}:{n}" for p in ("ingest.before-commit", "ingest.after-commit") for n in (1, 2, 4, 7)],
)
def test_a_failure_at_any_step_loses_nothing_and_the_rerun_adds_each_record_once(
    spark, settings, tmp_path, monkeypatch, point
):
    """A failure while creating or writing any table of a batch that spans new tables; the
    rerun ends with every input record in exactly one log or dead-letter table."""
    from connector.core.faults import FAIL_ENV, InjectedFailure, _hits

    lines = _mixed_lines()
    path = write_lines(tmp_path / "dump.jsonl", lines)
    catalog, ns = load_catalog(settings), settings.catalog.namespace
    _hits.clear()
    monkeypatch.setenv(FAIL_ENV, point)
    try:
        ingest(spark, FileSource(path), IngestJob(catalog, ns, Decoder(), 5))
        failed = False
    except InjectedFailure:
        failed = True
    monkeypatch.delenv(FAIL_ENV)
    assert failed, f"{point} was never reached"
    ingest(spark, FileSource(path), IngestJob(catalog, ns, Decoder(), 5))
    ingest(spark, FileSource(path), IngestJob(catalog, ns, Decoder(), 5))  # a replay adds nothing
    want = sorted((d["topic"], d["partition"], d["offset"]) for d in map(json.loads, lines))
    assert _held(catalog, ns) == want


HEADERS = (("trace", b"\xff\x00 not utf-8"), ("trace", b"second"), ("empty", None), ("", b""))


def _record(offset: int, value: bytes | None, headers=HEADERS):
    from datetime import UTC, datetime

    from connector.core.records import SourceRecord

    return SourceRecord(
        "db.public.things", 0, str(offset), offset, datetime(2026, 1, 1, tzinfo=UTC), b'{"id":1}', value, headers
    )


def _headers(spark, settings, name) -> dict[str, list | None]:
    """Read by Spark: pyiceberg 0.12 reads a null list as an empty one."""
    rows = spark.table(f"{settings.catalog.name}.{settings.catalog.namespace}.{name}").collect()
    return {r["offset"]: r["headers"] and [h.asDict() for h in r["headers"]] for r in rows}


def test_headers_reach_the_log_and_dead_letters_as_the_source_gives_them(spark, settings):
    """Repeated names, binary values that are not UTF-8, a null value, an empty name."""
    from tests.list_source import ListSource

    event = json.dumps({"op": "c", "after": {"id": 1}, "source": {"connector": "postgresql", "table": "things"}})
    records = [_record(0, event.encode()), _record(1, b"{not json"), _record(2, event.encode(), ())]
    catalog, ns = load_catalog(settings), settings.catalog.namespace
    ingest(spark, ListSource(records), IngestJob(catalog, ns, Decoder(), 10))
    want = [{"key": k, "value": v} for k, v in HEADERS]
    assert _headers(spark, settings, "things__log") == {"0": want, "2": None}
    assert _headers(spark, settings, "things__dead_letters") == {"1": want}


def test_a_log_that_kept_headers_as_text_keeps_that_text_and_takes_new_rows(spark, settings):
    """A log table of the earlier layout (headers as JSON text): its rows are not changed,
    the text moves to `headers_json`, and new rows carry their headers whole."""
    import pyarrow as pa

    from iceberg.layouts import LOG_SCHEMA
    from iceberg.log_writer import append_with_positions
    from tests.list_source import ListSource

    old = pa.schema([pa.field("headers", pa.string()) if f.name == "headers" else f for f in LOG_SCHEMA])
    catalog, ns = load_catalog(settings), settings.catalog.namespace
    catalog.create_namespace_if_not_exists(ns)
    table = catalog.create_table((ns, "things__log"), schema=old)
    event = json.dumps({"op": "c", "after": {"id": 1}, "source": {"connector": "postgresql", "table": "things"}})
    first = {f.name: None for f in old} | {
        "topic": "db.public.things",
        "partition": 0,
        "offset": "0",
        "sequence_number": 0,
        "enqueued_time": 0,
        "key": '{"id":1}',
        "op": "c",
        "snapshot": False,
        "tombstone": False,
        "payload_bytes": 1,
        "ingested_at": 0,
        "headers": '{"trace":"abc"}',
    }
    append_with_positions(table, pa.Table.from_pylist([first], old), {"db.public.things:0": 1})
    ingest(
        spark,
        ListSource([_record(0, event.encode()), _record(1, event.encode())]),
        IngestJob(catalog, ns, Decoder(), 10),
    )
    rows = {r["offset"]: r for r in catalog.load_table((ns, "things__log")).scan().to_arrow().to_pylist()}
    assert {o: (r["headers_json"], r["headers"]) for o, r in rows.items()} == {
        "0": ('{"trace":"abc"}', None),
        "1": (None, [{"key": k, "value": v} for k, v in HEADERS]),
    }


@pytest.mark.slow
@pytest.mark.parametrize("writers", [2, 3])
def test_concurrent_ingests_of_one_input_add_each_record_once(spark, settings, tmp_path, writers):
    """Several ingests of the same input at once, in small batches (many commits to interleave),
    each with its own catalog connection: each run either completes or stops with one line
    naming the table and the other writer; a rerun then completes the input. Every record ends
    in exactly one table, once, as one clean run leaves it."""
    _concurrent_ingests(spark, settings, tmp_path, writers)


@pytest.mark.rest
@pytest.mark.slow
def test_concurrent_ingests_through_a_rest_catalog_add_each_record_once(spark, settings, rest_catalog, tmp_path):
    """The same on Iceberg's REST catalog server: the commits are fenced by the server's
    checks of `main`."""
    catalog = settings.catalog.model_copy(
        update={"name": "restlake", "type": "rest", "uri": rest_catalog.uri, "warehouse": rest_catalog.warehouse}
    )
    _concurrent_ingests(spark, settings.model_copy(update={"catalog": catalog}), tmp_path, 3)


def _concurrent_ingests(spark, settings, tmp_path, writers: int) -> None:
    import threading

    from connector.core.errors import ConcurrentWriterError

    lines = _mixed_lines(60)
    path = write_lines(tmp_path / "dump.jsonl", lines)
    want = sorted((d["topic"], d["partition"], d["offset"]) for d in map(json.loads, lines))
    for attempt in range(2):
        ns = f"{settings.catalog.namespace}_{writers}_{attempt}"
        load_catalog(settings).create_namespace(ns)
        outcomes: list = []
        barrier = threading.Barrier(writers)

        def one(ns=ns, barrier=barrier, outcomes=outcomes):
            try:
                catalog = load_catalog(settings)
                barrier.wait(60)
                outcomes.append(ingest(spark, FileSource(path), IngestJob(catalog, ns, Decoder(), 7)).records)
            except ConcurrentWriterError as e:
                outcomes.append(str(e))
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                outcomes.append(e)

        threads = [threading.Thread(target=one) for _ in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(outcomes) == writers and not [o for o in outcomes if isinstance(o, Exception)], outcomes
        stopped = [o for o in outcomes if isinstance(o, str)]
        assert all(f"table {ns}." in m and "committed positions while this ingest was writing" in m for m in stopped)
        assert all(len(m.splitlines()) == 1 for m in stopped)
        ingest(spark, FileSource(path), IngestJob(load_catalog(settings), ns, Decoder(), 7))
        assert _held(load_catalog(settings), ns) == want, outcomes


def test_a_commit_of_another_branch_in_between_is_retried_over(spark, settings, tmp_path, monkeypatch):
    """Another commit lands on a log table between a batch's reload and its commit, moving
    neither `main` nor the positions (a second ingest's own branch, say): pyiceberg refuses
    the batch's snapshot for its stale sequence number, and the batch is committed again on
    top of it. Every record is held once."""
    from connector import sinks

    lines = _mixed_lines(30)
    path = write_lines(tmp_path / "dump.jsonl", lines)
    want = sorted((d["topic"], d["partition"], d["offset"]) for d in map(json.loads, lines))
    real, raced = sinks.commit_data_files, []

    def racing(table, written, props, branch):
        if not raced:  # the first batch's commit: another branch's snapshot just before it
            other = load_catalog(settings).load_table(".".join(table.name()[-2:]))
            other.manage_snapshots().create_branch(other.current_snapshot().snapshot_id, "elsewhere").commit()
            real(other.refresh(), [], {}, "elsewhere")
            raced.append(".".join(table.name()[-2:]))
        real(table, written, props, branch)

    monkeypatch.setattr(sinks, "commit_data_files", racing)
    ns = settings.catalog.namespace
    stats = ingest(spark, FileSource(path), IngestJob(load_catalog(settings), ns, Decoder(), 7))
    assert raced and stats.records == len(lines)
    assert _held(load_catalog(settings), ns) == want


def test_a_second_ingest_of_one_source_stops_at_once_naming_the_first_or_waits_for_it(spark, settings, tmp_path):
    """Through `run_ingest` (the CLI's route): the first run holds the source's `ingest` lease
    while it works (held here after its first batch); a second stops before reading anything,
    with one line naming the tables, the source and the first run; one given `wait` runs
    once the first is done and finds nothing left to add."""
    import os
    import socket
    import threading

    from connector.app import run_ingest
    from iceberg.leases import LeaseHeldError
    from tests.iceberg.helpers import with_source

    lines = _mixed_lines(30)
    path = write_lines(tmp_path / "dump.jsonl", lines)
    s = with_source(settings, path)
    s = s.model_copy(update={"source": s.source.model_copy(update={"batch_size": 7})})
    working, tried, done = threading.Event(), threading.Event(), []

    def hold(stats):
        working.set()
        tried.wait(60)

    first = threading.Thread(target=lambda: done.append(("first", run_ingest(s, hold).records)))
    first.start()
    assert working.wait(120)
    with pytest.raises(LeaseHeldError) as e:
        run_ingest(s)
    line = str(e.value)
    assert len(line.splitlines()) == 1
    assert line.startswith(f"tables {s.catalog.namespace}.* from file {path}: ingest on ") and (
        f"{socket.gethostname()} pid {os.getpid()}" in line and "--wait" in line
    ), line
    second = threading.Thread(target=lambda: done.append(("second", run_ingest(s, wait=120).records)))
    second.start()
    tried.set()
    first.join(180)
    second.join(180)
    assert done == [("first", len(lines)), ("second", 0)]
    want = sorted((d["topic"], d["partition"], d["offset"]) for d in map(json.loads, lines))
    assert _held(load_catalog(s), s.catalog.namespace) == want

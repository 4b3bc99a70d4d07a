"""Ingest + the Spark compaction job on real Iceberg tables (shared local Spark session)."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path
from unittest import mock
from urllib.parse import urlparse

import pyarrow as pa
import pytest

from connector.app import policy_of
from connector.core.config import TableConfig
from iceberg.catalog import load_catalog
from iceberg.compaction import job, writes
from iceberg.compaction.stats import clean_bytes, cleaner_points
from iceberg.log_writer import committed_positions
from iceberg.maintenance import MaintenancePolicy, shape_of, sql_literal
from iceberg.summary_keys import STALE_REASONS
from tests.conftest import kcat_lines
from tests.iceberg.helpers import (
    NOW,
    assert_recorded_bytes_are_held,
    assert_usage_told_by_metadata,
    compact_table,
    decoded,
    kline,
    names,
    offsets_by_key,
    pg,
    run_ingest,
    with_source,
    write_lines,
)
from tests.model import expected_tables

pytestmark = pytest.mark.spark


def test_spark_and_pyiceberg_share_one_catalog(spark, settings):
    catalog = load_catalog(settings)
    ns = settings.catalog.namespace
    spark.sql(f"CREATE TABLE {ns}.from_spark (id bigint, name string) USING iceberg")
    spark.sql(f"INSERT INTO {ns}.from_spark VALUES (1, 'a'), (2, 'b')")
    assert sorted(catalog.load_table(f"{ns}.from_spark").scan().to_arrow()["id"].to_pylist()) == [1, 2]
    t = catalog.create_table(f"{ns}.from_py", schema=pa.schema([pa.field("id", pa.int64())]))
    t.append(pa.table({"id": [7, 8, 9]}))
    assert spark.sql(f"SELECT sum(id) FROM {ns}.from_py").first()[0] == 24


@pytest.mark.parametrize(
    "fixture,table,topic",
    [
        ("mysql_customers_cdc_with_schema.jsonl", "customers", "dbserver1.inventory.customers"),
        ("postgres_products_cdc_plain.jsonl", "products", "fullfillment.inventory.products"),
        ("mysql_products_legacy_snapshot_as_create_plain.jsonl", "products", "dbserver1.inventory.products"),
    ],
)
def test_fixture_stream_compacts_to_the_model(spark, settings, fixtures, tmp_path, fixture, table, topic):
    values = [v for v in (fixtures / fixture).read_text().splitlines() if v.strip()]
    keys = []
    for v in values:
        doc = json.loads(v)
        doc = doc.get("payload", doc)
        keys.append({"id": (doc["after"] or doc["before"])["id"]})
    # each delete is followed by its Debezium tombstone
    lines, vals, ks = [], [], []
    for k, v in zip(keys, values):
        vals.append(v), ks.append(k)
        if '"op":"d"' in v:
            vals.append(None), ks.append(k)
    lines = kcat_lines(topic, vals, ks)
    s = with_source(
        settings.model_copy(update={"tables": {table: TableConfig(key_fields=["id"])}}),
        write_lines(tmp_path / "in.jsonl", lines),
    )
    run_ingest(s)
    report = compact_table(spark, s, table)
    state, tombs = expected_tables(decoded(tmp_path / "in.jsonl", s), "source")
    assert offsets_by_key(s, names(s, table).state) == state
    assert offsets_by_key(s, names(s, table).tombstones) == tombs
    assert report.events == len(lines) and report.keys == len(state) + len(tombs)
    # typed columns, readable by pyiceberg through merge-on-read deletes
    rows = load_catalog(s).load_table(names(s, table).state).scan().to_arrow()
    assert rows.num_rows == len(state)
    assert pa.types.is_integer(rows.schema.field("id").type)


def test_stale_event_in_a_later_round_is_counted_and_ignored(spark, settings, tmp_path):
    f = tmp_path / "in.jsonl"
    first = [pg("c", 1, 10), pg("u", 1, 20)]
    s = with_source(settings, write_lines(f, kcat_lines("db.s.things", first, [{"id": 1}] * 2)))
    run_ingest(s)
    compact_table(spark, s, "things")
    write_lines(f, kcat_lines("db.s.things", first + [pg("u", 1, 15), pg("r", 1, 20, "true")], [{"id": 1}] * 4))
    run_ingest(s)
    report = compact_table(spark, s, "things")
    assert report.events == 2, "the first round (an INSERT into the empty state) recorded its cleaner points"
    assert report.stale == 2 and report.upserts == 0
    assert report.stale_reasons == {"older_than_state": 1, "snapshot_after_stream": 1}
    t = names(s, "things")
    assert offsets_by_key(s, t.state) == {'{"id":1}': "1"}
    # recorded one by one, and counted in the round's commit
    rows = load_catalog(s).load_table(t.stale).scan().to_arrow().to_pylist()
    assert sorted((r["_offset"], r["reason"], r["_source_position"]) for r in rows) == [
        ("2", "older_than_state", [15]),
        ("3", "snapshot_after_stream", [20]),
    ]
    snapshot = load_catalog(s).load_table(t.state).current_snapshot()
    assert STALE_REASONS.of(snapshot) == {"older_than_state": 1, "snapshot_after_stream": 1}


def test_a_round_releases_the_checkpoints_it_made(spark, settings, tmp_path):
    f = tmp_path / "in.jsonl"
    first = [pg("c", 1, 10), pg("u", 1, 20), pg("c", 2, 30)]
    keys = [{"id": 1}] * 2 + [{"id": 2}]
    s = with_source(settings, write_lines(f, kcat_lines("db.s.things", first, keys)))
    run_ingest(s)
    compact_table(spark, s, "things")
    write_lines(f, kcat_lines("db.s.things", first + [pg("u", 1, 15), pg("u", 2, 40)], keys + keys[1:]))
    run_ingest(s)
    pinned = set(spark.sparkContext._jsc.getPersistentRDDs().keySet())
    report = compact_table(spark, s, "things")  # held rows, winners, changes and stale rows: checkpointed
    assert report.stale == 1 and report.upserts == 1
    assert set(spark.sparkContext._jsc.getPersistentRDDs().keySet()) == pinned


def test_a_first_round_writes_the_state_in_a_file_per_core_however_the_log_is_split(spark, settings, tmp_path):
    lines = kcat_lines("db.s.things", [pg("c", i, 10 + i) for i in range(12)], [{"id": i} for i in range(12)])
    s = with_source(settings, write_lines(tmp_path / "in.jsonl", lines))
    s = s.model_copy(update={"source": s.source.model_copy(update={"batch_size": 2})})
    run_ingest(s)
    t = names(s, "things")
    with load_catalog(s).load_table(t.log).transaction() as tx:  # a split per file: the winners in many partitions
        tx.set_properties({"read.split.target-size": "1"})
    compact_table(spark, s, "things")
    assert offsets_by_key(s, t.state) == expected_tables(decoded(tmp_path / "in.jsonl", s), "source")[0]
    assert load_catalog(s).load_table(t.state).inspect.files().num_rows <= spark.sparkContext.defaultParallelism


ODD_KEYS = ["plain", "it's", "back\\slash", "\\'", "50\\%_x", "line\nbreak", "ünï €"]


def test_a_key_of_any_characters_is_written_in_sql_as_itself(spark):
    assert [spark.sql("SELECT " + sql_literal(k)).first()[0] for k in ODD_KEYS] == ODD_KEYS


@pytest.mark.parametrize("named", [True, False], ids=["held-keys-named", "whole-table-join"])
def test_a_round_over_held_keys_of_any_characters_ends_as_the_model(spark, settings, tmp_path, monkeypatch, named):
    """The second round updates, deletes and re-creates keys the first one wrote: its MERGEs
    join the rows held for them, named in the statement (or the whole tables)."""
    if not named:
        monkeypatch.setattr(job, "HELD_KEYS_MAX", 0)
    first = [kline(i % 2, i // 2, k, pg("c", k, 10 + i), i) for i, k in enumerate(ODD_KEYS)]
    first += [kline(0, 4, "it's", pg("d", "it's", 30), 7), kline(0, 5, "it's", None, 8)]
    second = [
        kline(1, 4, "back\\slash", pg("u", "back\\slash", 40), 9),
        kline(0, 6, "it's", pg("c", "it's", 41), 10),
        kline(0, 7, "\\'", pg("d", "\\'", 42), 11),
        kline(0, 8, "\\'", None, 12),
        kline(1, 5, "new'\\", pg("c", "new'\\", 43), 13),
    ]
    s = with_source(settings, write_lines(tmp_path / "in.jsonl", first + second))
    for n in (len(first), None):
        run_ingest(s, max_records=n)
        compact_table(spark, s, "things")
    state, tombstones = expected_tables(decoded(tmp_path / "in.jsonl", s), "source")
    t = names(s, "things")
    assert (offsets_by_key(s, t.state), offsets_by_key(s, t.tombstones)) == (state, tombstones)
    assert len(state) == len(ODD_KEYS) and len(tombstones) == 1


def test_min_compaction_lag_holds_back_young_events(spark, settings, tmp_path):
    lines = kcat_lines("db.s.things", [pg("c", 1, 10), pg("c", 2, 11)], [{"id": 1}, {"id": 2}])
    doc = json.loads(lines[1])
    doc["ts"] = int((NOW - timedelta(seconds=30)).timestamp() * 1000)
    lines[1] = json.dumps(doc)
    lines[0] = json.dumps({**json.loads(lines[0]), "ts": int((NOW - timedelta(hours=2)).timestamp() * 1000)})
    s = with_source(settings, write_lines(tmp_path / "in.jsonl", lines), min_compaction_lag_seconds=60)
    run_ingest(s)
    report = compact_table(spark, s, "things", force=False)
    assert [(r.start, r.end) for r in report.ranges] == [(0, 1)]
    assert offsets_by_key(s, names(s, "things").state) == {'{"id":1}': "0"}
    assert_usage_told_by_metadata(s, "things", compacted=True)  # the young event's bytes, left dirty


def test_maintenance_bounds_files_and_snapshots_and_keeps_the_cleaner_points(spark, settings, tmp_path):
    """Rounds of updates leave small data files, delete files, log manifests and snapshots
    behind; a round with maintenance due rewrites and expires them, and the next round still
    ingests from the positions, compacts from the cleaner points and ends with the model's
    tables."""
    f, values, keys = tmp_path / "in.jsonl", [], []
    s = with_source(settings, f)
    t = names(s, "things")
    catalog = load_catalog(s)

    def round_of(i: int, maintenance: MaintenancePolicy):
        values.extend(
            [pg("c" if i == 0 else "u", k, 10 * i + k) for k in range(3)] + ([pg("d", 0, 10 * i + 5)] if i == 2 else [])
        )
        keys.extend([{"id": k} for k in range(3)] + ([{"id": 0}] if i == 2 else []))
        write_lines(f, kcat_lines("db.s.things", values, keys))
        run_ingest(s)
        return compact_table(spark, s, "things", maintenance=maintenance)

    for i in range(3):
        assert round_of(i, MaintenancePolicy(enabled=False)).maintenance == []
    before = shape_of(catalog.load_table(t.state))
    assert before.data_files >= 3 and before.delete_files >= 1
    # the planner's clean bytes, read a file at a time with pyiceberg, skip the deleted rows as Spark does
    held = spark.sql(f"SELECT sum(_payload_bytes) FROM {t.spark(t.state)}").first()[0]
    assert clean_bytes(catalog.load_table(t.state)) == {"db.s.things:0": held}
    assert len(catalog.load_table(t.state).snapshots()) >= 3
    eager = MaintenancePolicy(snapshot_retention=timedelta(0), rewrite_files=2, expire_batch=1)
    # what killed writes leave: files no snapshot refers to, old and young
    old, young = [], []
    for name in (t.state, t.log):
        location = Path(urlparse(catalog.load_table(name).location()).path)
        for kind, suffix in (("data", ".parquet"), ("metadata", ".metadata.json")):
            for ages, age in ((old, 2 * 86400), (young, 60)):
                orphan = location / kind / f"orphan-{age}{suffix}"
                orphan.write_bytes(b"left by a killed write")
                os.utime(orphan, (time.time() - age, time.time() - age))
                ages.append(orphan)
    report = round_of(3, eager)
    assert [p.exists() for p in old + young] == [False] * len(old) + [True] * len(young)
    assert f"remove orphan files {t.log} (2)" in report.maintenance
    assert f"rewrite {t.state}" in report.maintenance
    assert any(a.startswith(f"expire {t.state} ") for a in report.maintenance)
    state = catalog.load_table(t.state)
    after = shape_of(state)
    assert (after.data_files, after.delete_files) == (1, 0), "small files joined, dangling deletes dropped"
    # the round's own snapshot (with the cleaner points) and the rewrite after it (a format-3
    # table holds deletion vectors, which the data files' rewrite drops: no position-delete files)
    assert len(state.snapshots()) == 2
    assert cleaner_points(state) == {"db.s.things:0": len(values)}
    assert offsets_by_key(s, t.state) == expected_tables(decoded(f, s), "source")[0]
    # the log: its manifests (one per ingest commit) joined, its old snapshots expired, its positions kept
    assert f"rewrite manifests {t.log}" in report.maintenance
    assert any(a.startswith(f"expire {t.log} ") for a in report.maintenance)
    log_table = catalog.load_table(t.log)
    assert len(log_table.current_snapshot().manifests(log_table.io)) == 1
    assert committed_positions(log_table) == {"db.s.things:0": len(values)}
    report = round_of(4, eager)
    assert report.events == 3, "the next round starts at the cleaner points"
    assert catalog.load_table(t.log).scan().to_arrow().num_rows == len(values), "ingest resumed at its positions"
    state_rows, tomb_rows = expected_tables(decoded(f, s), "source")
    assert offsets_by_key(s, t.state) == state_rows
    assert offsets_by_key(s, t.tombstones) == tomb_rows


@pytest.mark.parametrize(
    "sql,says", [("SELEC 1", "PARSE_SYNTAX_ERROR"), ("SELECT * FROM nowhere.nothing", "TABLE_OR_VIEW_NOT_FOUND")]
)
def test_a_query_spark_refuses_is_one_line_with_sparks_message(spark, settings, sql, says):
    from connector.report import QueryError, print_query

    with pytest.raises(QueryError) as e:
        print_query(settings, sql, 5)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_an_event_the_table_cannot_hold_is_a_dead_letter_and_the_table_goes_on(spark, settings, tmp_path):
    """Key 2's `v` is a string where the table's is an integer: key 2's event is a dead letter
    (reason `schema`, naming the column and both types), every other change is applied, the
    cleaner point moves past it, and later rounds go on."""
    f = tmp_path / "in.jsonl"

    def pg(key, lsn, v):
        return json.dumps(
            {
                "op": "c",
                "after": {"id": key, "v": v},
                "source": {"connector": "postgresql", "table": "things", "lsn": lsn},
            }
        )

    first = [pg(1, 10, 5), pg(2, 11, "five"), pg(3, 12, 7)]
    s = with_source(settings, write_lines(f, kcat_lines("db.s.things", first, [{"id": k} for k in (1, 2, 3)])))
    run_ingest(s)
    report = compact_table(spark, s, "things")
    assert report.refused == 1 and report.upserts == 2
    t = names(s, "things")
    catalog = load_catalog(s)
    assert offsets_by_key(s, t.state) == {'{"id":1}': "0", '{"id":3}': "2"}
    dead = catalog.load_table(t.dead_letters).scan().to_arrow().to_pylist()
    assert [(d["offset"], d["reason"], d["key"], d["value"]) for d in dead] == [
        ("1", "schema", b'{"id":2}', first[1].encode())
    ]
    assert "'v'" in dead[0]["detail"] and "bigint" in dead[0]["detail"] and "string" in dead[0]["detail"]
    assert cleaner_points(catalog.load_table(t.state)) == {"db.s.things:0": 3}
    # the next round: key 2 again, as an integer, and a replayed round adds no second dead letter
    write_lines(f, kcat_lines("db.s.things", first + [pg(2, 13, 6)], [{"id": k} for k in (1, 2, 3, 2)]))
    run_ingest(s)
    assert compact_table(spark, s, "things").upserts == 1
    assert offsets_by_key(s, t.state) == {'{"id":1}': "0", '{"id":2}': "3", '{"id":3}': "2"}
    assert len(catalog.load_table(t.dead_letters).scan().to_arrow()) == 1


def test_two_compactions_at_once_end_as_one_clean_run(spark, settings, tmp_path):
    """Two rounds of the same table started together: one holds the table's lease and the
    other stops with one line naming it, or, with `wait`, runs after it; the tables end as
    one clean round over the same input leaves them (the model), with no duplicate row."""
    import threading

    from iceberg.compaction.job import compact
    from iceberg.leases import LeaseHeldError

    values, keys = [], []
    for i in range(60):
        values += [pg("c", i % 20, 10 + i)] if i % 7 else [pg("d", i % 20, 10 + i), None]
        keys += [{"id": i % 20}] * (1 if i % 7 else 2)
    lines = kcat_lines("db.s.things", values, keys)
    f = tmp_path / "in.jsonl"
    s = with_source(settings, f)
    n = names(s, "things")
    for wait, upto in ((0.0, 40), (120.0, len(lines))):
        write_lines(f, lines[:upto])
        run_ingest(s)
        want = expected_tables(decoded(f, s), "source")
        outcomes: list = []
        barrier = threading.Barrier(2)

        def one(wait=wait, outcomes=outcomes, barrier=barrier):
            catalog = load_catalog(s)
            barrier.wait(60)
            try:
                outcomes.append(compact(spark, catalog, n, policy_of(s), NOW, True, wait).events)
            except LeaseHeldError as e:
                outcomes.append(str(e))

        threads = [threading.Thread(target=one) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stopped = [o for o in outcomes if isinstance(o, str)]
        assert len(outcomes) == 2 and all("table " + n.state in m and "compaction on" in m for m in stopped)
        assert (len(stopped) == 1) if wait == 0 else (stopped == []), outcomes
        assert (offsets_by_key(s, n.state), offsets_by_key(s, n.tombstones)) == want


@pytest.mark.parametrize("small,broadcast", [(True, True), (False, True), (False, False)])
def test_rounds_remove_held_rows_by_position_one_deletion_vector_per_file(
    spark, settings, tmp_path, monkeypatch, request, small, broadcast
):
    """Rounds without truncate write through Iceberg's API (`writes.commit_delta`), small ones
    and, into tables holding rows, larger ones (the packed route here, their held rows joined
    to the winners sent to every task or shuffled, `broadcast`): each removes the rows its
    keys held by position. Round after round over the same data files, each file keeps one
    deletion vector that carries every earlier round's deletes too, and Spark and pyiceberg
    read the model's tables."""
    import random

    draw, lines, offsets, lsn = random.Random(11), [], [0, 0], 10
    monkeypatch.setattr(job, "BROADCAST_HELD", job.BROADCAST_HELD if broadcast else -1)
    if not broadcast:  # nor by Spark's own choice: a shuffled join
        before = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
        request.addfinalizer(lambda: spark.conf.set("spark.sql.autoBroadcastJoinThreshold", before))
    s = with_source(settings, tmp_path / "in.jsonl")
    t = names(s, "things")
    for r in range(4):
        for k in range(40) if r == 0 else draw.sample(range(50), 15):
            lsn, part = lsn + 1, draw.randrange(2)
            op = "c" if r == 0 else draw.choice("cud")
            lines.append(kline(part, offsets[part], k, pg(op, k, lsn), lsn))
            offsets[part] += 1
            if op == "d":
                lines.append(kline(part, offsets[part], k, None, lsn))
                offsets[part] += 1
        write_lines(tmp_path / "in.jsonl", lines)
        run_ingest(s)
        with mock.patch.object(writes, "commit_delta", wraps=writes.commit_delta) as delta:
            report = compact_table(spark, s, "things", packed=not small)
        assert report.events and report.events <= policy_of(s).small_round  # small_round 0 where packed
        assert delta.called == (small or r > 0), r  # a large first round INSERTs
        state, tombstones = expected_tables(decoded(tmp_path / "in.jsonl", s), "source")
        assert (offsets_by_key(s, t.state), offsets_by_key(s, t.tombstones)) == (state, tombstones), r
        for name, want in ((t.state, state), (t.tombstones, tombstones)):
            read = spark.table(t.spark(name)).select("_key", "_offset").collect()
            assert {k: o for k, o in read} == want and len(read) == len(want), (r, name)
            deletes = spark.sql(f"SELECT referenced_data_file, file_format FROM {t.spark(name)}.delete_files").collect()
            files = [d.referenced_data_file for d in deletes]
            assert len(files) == len(set(files)) and {d.file_format for d in deletes} <= {"PUFFIN"}, (r, name)
    assert_recorded_bytes_are_held(s, "things")

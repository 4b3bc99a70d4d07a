"""Ingest + the Spark compaction job on real Iceberg tables (shared local Spark session)."""

from __future__ import annotations

import json
from datetime import timedelta

import pyarrow as pa
import pytest

from connector.config import TableConfig
from iceberg.catalog import load_catalog
from iceberg.compaction.stats import clean_bytes, cleaner_points
from iceberg.log_writer import committed_positions
from iceberg.maintenance import MaintenancePolicy, shape_of
from tests.conftest import kcat_lines
from tests.iceberg.helpers import (NOW, compact_table, decoded, names, offsets_by_key, run_ingest, with_source,
                                   write_lines)
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


@pytest.mark.parametrize("fixture,table,topic", [
    ("mysql_customers_cdc_with_schema.jsonl", "customers", "dbserver1.inventory.customers"),
    ("postgres_products_cdc_plain.jsonl", "products", "fullfillment.inventory.products"),
    ("mysql_products_legacy_snapshot_as_create_plain.jsonl", "products", "dbserver1.inventory.products"),
])
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
    s = with_source(settings.model_copy(update={"tables": {table: TableConfig(key_fields=["id"])}}),
                    write_lines(tmp_path / "in.jsonl", lines))
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


def _pg(op, key, lsn, snapshot="false"):
    return json.dumps({"op": op, "before": None, "after": None if op == "d" else {"id": key, "v": lsn},
                       "source": {"connector": "postgresql", "table": "things", "lsn": lsn, "snapshot": snapshot}})


def test_stale_event_in_a_later_round_is_counted_and_ignored(spark, settings, tmp_path):
    f = tmp_path / "in.jsonl"
    first = [_pg("c", 1, 10), _pg("u", 1, 20)]
    s = with_source(settings, write_lines(f, kcat_lines("db.s.things", first, [{"id": 1}] * 2)))
    run_ingest(s)
    compact_table(spark, s, "things")
    write_lines(f, kcat_lines("db.s.things", first + [_pg("u", 1, 15), _pg("r", 1, 20, "true")], [{"id": 1}] * 4))
    run_ingest(s)
    report = compact_table(spark, s, "things")
    assert report.events == 2, "the first round (an INSERT into the empty state) recorded its cleaner points"
    assert report.stale == 2 and report.upserts == 0
    assert offsets_by_key(s, names(s, "things").state) == {'{"id":1}': "1"}


def test_truncate_removes_every_older_key(spark, settings, tmp_path):
    values = [_pg("c", 1, 10), _pg("c", 2, 11),
              json.dumps({"op": "t", "source": {"connector": "postgresql", "table": "things", "lsn": 12}}),
              _pg("c", 3, 13)]
    s = with_source(settings, write_lines(tmp_path / "in.jsonl", kcat_lines(
        "db.s.things", values, [{"id": 1}, {"id": 2}, None, {"id": 3}])))
    run_ingest(s)
    report = compact_table(spark, s, "things")
    assert report.truncates == 1
    assert offsets_by_key(s, names(s, "things").state) == {'{"id":3}': "3"}
    assert offsets_by_key(s, names(s, "things").tombstones) == {'{"id":1}': "2", '{"id":2}': "2"}


def test_tombstones_guard_within_retention_then_are_purged(spark, settings, tmp_path):
    f = tmp_path / "in.jsonl"
    s = with_source(settings, write_lines(f, kcat_lines("db.s.things", [_pg("c", 1, 10), _pg("d", 1, 20), None],
                                                       [{"id": 1}] * 3)), tombstone_retention_hours=24)
    run_ingest(s)
    compact_table(spark, s, "things", now=NOW)
    tombs = names(s, "things").tombstones
    assert offsets_by_key(s, tombs) == {'{"id":1}': "2"}
    # a late older event inside the window does not resurrect the key
    late = json.loads(kcat_lines("db.s.things", [_pg("u", 1, 15)], [{"id": 1}])[0]) | {"offset": 3}
    write_lines(f, f.read_text().splitlines() + [json.dumps(late)])
    run_ingest(s)
    r = compact_table(spark, s, "things", now=NOW + timedelta(hours=23))
    assert r.stale == 1 and offsets_by_key(s, names(s, "things").state) == {}
    assert compact_table(spark, s, "things", now=NOW + timedelta(hours=24, seconds=1)).purged == 1
    assert offsets_by_key(s, tombs) == {}


def test_min_compaction_lag_holds_back_young_events(spark, settings, tmp_path):
    lines = kcat_lines("db.s.things", [_pg("c", 1, 10), _pg("c", 2, 11)], [{"id": 1}, {"id": 2}])
    doc = json.loads(lines[1])
    doc["ts"] = int((NOW - timedelta(seconds=30)).timestamp() * 1000)
    lines[1] = json.dumps(doc)
    lines[0] = json.dumps({**json.loads(lines[0]), "ts": int((NOW - timedelta(hours=2)).timestamp() * 1000)})
    s = with_source(settings, write_lines(tmp_path / "in.jsonl", lines), min_compaction_lag_seconds=60)
    run_ingest(s)
    report = compact_table(spark, s, "things", force=False)
    assert [(r.start, r.end) for r in report.ranges] == [(0, 1)]
    assert offsets_by_key(s, names(s, "things").state) == {'{"id":1}': "0"}


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
        values.extend([_pg("c" if i == 0 else "u", k, 10 * i + k) for k in range(3)] + ([_pg("d", 0, 10 * i + 5)]
                                                                                          if i == 2 else []))
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
    report = round_of(3, eager)
    assert f"rewrite {t.state}" in report.maintenance
    assert any(a.startswith(f"expire {t.state} ") for a in report.maintenance)
    state = catalog.load_table(t.state)
    after = shape_of(state)
    assert (after.data_files, after.delete_files) == (1, 0), "small files joined, dangling deletes dropped"
    # the round's own snapshot (with the cleaner points) and the two rewrites after it
    assert len(state.snapshots()) == 3
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

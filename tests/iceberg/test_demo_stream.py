"""The demo stream end to end on Spark: semantics, Debezium types, stale events, and the model."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from connector.demo import LATE_EVENTS, write_demo_file
from iceberg.catalog import load_catalog
from tests.iceberg.helpers import compact_table, decoded, names, offsets_by_key, run_ingest, with_source, write_lines
from tests.model import expected_tables

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def demo(spark, work_root, tmp_path_factory):
    from connector.core.config import load_settings

    s = load_settings(work_dir=work_root, catalog={"namespace": "demo_stream"})
    path = write_demo_file(tmp_path_factory.mktemp("demo") / "events.jsonl")
    s = with_source(s, path)
    total = len(path.read_text().splitlines())
    run_ingest(s, max_records=total - LATE_EVENTS)
    first = {t: compact_table(spark, s, t) for t in ("customers", "orders", "products")}
    run_ingest(s)
    second = {t: compact_table(spark, s, t) for t in ("customers", "orders")}
    return s, path, first, second


def test_demo_tables_match_the_model(demo):
    s, path, _, _ = demo
    events = [e for e in decoded(path, s) if hasattr(e, "op")]
    for table in ("customers", "orders", "products"):
        state, tombs = expected_tables([e for e in events if e.table == table], "source")
        assert offsets_by_key(s, names(s, table).state) == state, table
        assert offsets_by_key(s, names(s, table).tombstones) == tombs, table


def test_demo_semantics(demo, spark):
    s, _, first, second = demo
    ns = s.catalog.namespace
    keys = {r[0] for r in spark.sql(f"SELECT _key FROM {ns}.customers").collect()}
    assert keys == {'{"id":2}', '{"id":4}', '{"id":5}', '{"id":10}'}  # 1 moved to 10, 3 deleted
    assert spark.sql(f"SELECT email FROM {ns}.customers WHERE id = 2").first()[0] == "gb@bailey.org"
    assert second["customers"].stale == 1 and second["orders"].stale == 1
    assert second["customers"].upserts == second["orders"].upserts == 0
    assert first["products"].keys == 3
    dead = spark.sql(f"SELECT reason, offset FROM {ns}.products__dead_letters").collect()
    assert [(r.reason, r.offset) for r in dead] == [("json", "4")]


def test_debezium_types_reach_the_state_table(demo):
    s, *_ = demo
    t = load_catalog(s).load_table(names(s, "orders").state)
    types = {f.name: str(f.field_type) for f in t.schema().fields}
    assert types["order_date"] == "date" and types["total"] == "decimal(10, 2)" and types["order_number"] == "int"
    row = [r for r in t.scan().to_arrow().to_pylist() if r["order_number"] == 1001][0]
    assert row["total"] == Decimal("24.50") and row["status"] == "paid" and row["order_date"].year == 2025


def test_new_columns_are_added_in_a_later_round(spark, settings, tmp_path):
    def line(offset, after):
        return json.dumps(
            {
                "topic": "db.s.things",
                "partition": 0,
                "offset": offset,
                "ts": 1,
                "key": '{"id":1}',
                "payload": json.dumps(
                    {
                        "op": "u",
                        "after": after,
                        "source": {"connector": "postgresql", "table": "things", "lsn": 10 + offset},
                    }
                ),
            }
        )

    f = write_lines(tmp_path / "in.jsonl", [line(0, {"id": 1, "v": "a"})])
    s = with_source(settings, f)
    run_ingest(s)
    compact_table(spark, s, "things")
    write_lines(f, [line(0, {"id": 1, "v": "a"}), line(1, {"id": 1, "v": "b", "extra": 2.5})])
    run_ingest(s)
    compact_table(spark, s, "things")
    rows = load_catalog(s).load_table(names(s, "things").state).scan().to_arrow().to_pylist()
    assert [(r["v"], r["extra"]) for r in rows] == [("b", 2.5)]


@pytest.mark.slow
def test_the_demo_leaves_a_configuration_that_every_command_runs_on(tmp_path):
    """`cdclake demo` in its own process (its own catalog), then `status` and `read` on its
    tables through the configuration it leaves: what `read` gives is each key the demo's
    state and tombstone tables hold (read here with pyiceberg), once."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from connector.core.config import load_settings

    work = tmp_path / "demo"
    root = Path(__file__).resolve().parents[2]

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "connector.cli", *args],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=root,
            env={**os.environ, "COLUMNS": "80"},
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    said = cli("demo", "--work-dir", str(work))
    rows = [line.split() for line in said.splitlines()]
    # on 80 columns, its tables are tables, each row on a line of its own
    assert ['{"id":4}', "0", "1", "r", "[1000]", "Anne", "anne@kretchmar.net"] in rows, said
    assert ["customers", "0", "0.00", "-", "1.18", "KB", "of", "1", "GB", "(<0.01%)"] in rows, said
    assert ["3", "tables,", "0", "due,", "0", "lagging"] in rows, said
    assert not [line for line in said.splitlines() if " INFO " in line], "step timings only with -v"
    config = work / "cdclake.toml"
    assert f"cdclake status -c {config}" in " ".join(said.split())
    statuses = json.loads(cli("status", "-c", str(config), "--json"))
    assert {s["table"] for s in statuses} == {"customers", "orders", "products"}
    customers = [s for s in statuses if s["table"] == "customers"]
    counts = (sum(s["live_rows"] for s in customers), sum(s["tombstones"] for s in customers))
    assert (len(customers), *counts) == (2, 4, 2)  # partitions, live rows, tombstones
    read = [json.loads(line) for line in cli("read", "customers", "-c", str(config)).splitlines()]
    s = load_settings(config)
    catalog, n = load_catalog(s), names(s, "customers")
    held = {
        r["_key"]: r["_offset"]
        for name in (n.state, n.tombstones)
        for r in catalog.load_table(name).scan(selected_fields=("_key", "_offset")).to_arrow().to_pylist()
    }
    assert sorted((r["key"], r["offset"]) for r in read) == sorted(held.items())

"""`cdclake verify`: a table built in several rounds verifies clean against its log; what is
broken behind the product's back (a Spark UPDATE, DELETE or INSERT on the tables) is
reported by key and kind, exactly those keys; a lost data file is one clear line."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

import pytest
from typer.testing import CliRunner

from connector.app import policy_of
from iceberg.catalog import load_catalog
from iceberg.compaction.stats import cleaner_points
from iceberg.log_writer import committed_positions
from iceberg.summary_keys import KEYS, ORDERING, TRUNCATE
from iceberg.verify import rebuild, verify
from tests.iceberg.helpers import (
    assert_usage_told_by_metadata,
    compact_table,
    decoded,
    names,
    offsets_by_key,
    run_ingest,
    with_source,
    write_lines,
)
from tests.iceberg.test_reader import _stream
from tests.model import expected_tables

pytestmark = pytest.mark.spark


def test_verify_finds_exactly_what_was_broken(spark, settings, tmp_path):
    lines = _stream(150, seed=11)
    path = write_lines(tmp_path / "in.jsonl", [json.dumps(line) for line in lines])
    s = with_source(settings, path)
    for part in (60, None):
        run_ingest(s, max_records=part)
        compact_table(spark, s, "things")
    catalog, n = load_catalog(s), names(s, "things")
    now = datetime.now(UTC)
    clean = verify(spark, catalog, n, policy_of(s), now)
    assert clean.ok, clean.counts
    assert clean.events == len(lines) and set(clean.horizon) == {f"pg.inventory.things:{p}" for p in range(3)}
    assert [x for x in catalog.list_namespaces() if x[0].startswith("cdclake_verify_")] == []  # scratch dropped

    live = sorted(r["id"] for r in catalog.load_table(n.state).scan(selected_fields=("id",)).to_arrow().to_pylist())
    changed, gone, moved = live[:3]
    state, tombstones = n.spark(n.state), n.spark(n.tombstones)
    spark.sql(f"UPDATE {state} SET v = -1 WHERE id = {changed}")
    spark.sql(f"DELETE FROM {state} WHERE id = {gone}")
    spark.sql(f"UPDATE {state} SET _offset = '9999' WHERE id = {moved}")
    from pyspark.sql import functions as F

    spark.table(tombstones).limit(1).withColumn("_key", F.lit('{"id":99}')).writeTo(tombstones).append()
    broken = verify(spark, catalog, n, policy_of(s), now)
    key = lambda i: json.dumps({"id": i}, separators=(",", ":"))  # noqa: E731
    assert broken.counts["state"] == {"missing": 1, "extra": 0, "different offset": 1, "different row": 1}
    assert broken.samples["state"] == {
        "missing": [key(gone)], "different offset": [key(moved)], "different row": [key(changed)]
    }  # fmt: skip
    assert broken.counts["tombstones"]["extra"] == 1 and broken.samples["tombstones"]["extra"] == [key(99)]

    from connector.cli import app

    env = {
        "CDCLAKE_WORK_DIR": str(s.work_dir),
        "CDCLAKE_CATALOG__NAMESPACE": s.catalog.namespace,
        "CDCLAKE_SOURCE__PATH": str(path),
    }
    result = CliRunner().invoke(app, ["verify", "things"], env=env)
    assert result.exit_code == 1 and key(gone) in result.output and f"{len(lines):,} events" in result.output

    # rebuild puts the recomputation in place: the model's tables, the cleaner points at the log's end
    result = CliRunner().invoke(app, ["rebuild", "things"], env=env)
    assert result.exit_code == 0, result.output
    assert verify(spark, catalog, n, policy_of(s), now).ok
    want_state, want_tombstones = expected_tables(decoded(path, s), "source")
    assert offsets_by_key(s, n.state) == want_state and offsets_by_key(s, n.tombstones) == want_tombstones
    assert cleaner_points(catalog.load_table(n.state)) == committed_positions(catalog.load_table(n.log))
    assert_usage_told_by_metadata(s, "things", compacted=False)  # the rebuild's commit records no round

    (task, *_) = catalog.load_table(n.state).scan().plan_files()
    lost = urlparse(task.file.file_path).path
    Path(lost).unlink()
    result = CliRunner().invoke(app, ["verify", "things"], env=env)
    said = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(said) == 1 and lost in said[0], result.output


def test_rebuild_writes_the_ordering_rule_with_the_state(spark, settings, tmp_path):
    """The rebuild's state commit holds every summary key the registry says rebuild keeps,
    the ordering rule among them (a table built by "log": a reader's default would hide its
    loss); a rebuild by another rule records that one."""
    path = write_lines(tmp_path / "in.jsonl", [json.dumps(line) for line in _stream(60, seed=3)])
    s = with_source(settings, path, ordering="log")
    run_ingest(s)
    compact_table(spark, s, "things")
    catalog, n, now = load_catalog(s), names(s, "things"), datetime.now(UTC)
    assert ORDERING.read(catalog.load_table(n.state)) == "log"

    rebuild(spark, catalog, n, policy_of(s), now)
    rebuilt = catalog.load_table(n.state).current_snapshot()
    assert ORDERING.of(rebuilt) == "log"  # on the rebuild's own commit, not only on an older one
    kept = {k.name for k in KEYS if k.rebuild_keeps and "state" in k.tables} - {TRUNCATE.name}  # the stream has none
    assert kept <= set(rebuilt.summary.additional_properties)

    rebuild(spark, catalog, n, dataclasses.replace(policy_of(s), ordering="source"), now)
    assert ORDERING.read(catalog.load_table(n.state)) == "source"


def test_a_trimmed_log_keeps_the_position_a_bare_tombstone_takes_from_its_delete(spark, settings, tmp_path):
    """A bare tombstone takes its delete's source position; once log retention has trimmed
    the old events, the delete stays in the log with the tombstone, so that verify and
    rebuild recompute the tombstone's position (the tombstones outlive the log's retention)."""
    from tests.iceberg.helpers import NOW, kline, pg

    lines = []
    for i, (key, op) in enumerate([(1, "c"), (2, "c"), (1, "u"), (1, "d"), (2, "u"), (3, "c"), (2, "d")]):
        lines.append(kline(0, len(lines), key, pg(op, key, 100 + i), len(lines)))
        if op == "d":
            lines.append(kline(0, len(lines), key, None, len(lines)))
    s = with_source(
        settings, write_lines(tmp_path / "in.jsonl", lines), log_retention_hours=1, tombstone_retention_hours=1
    )
    run_ingest(s)
    report = compact_table(spark, s, "things", log_retention=True)
    assert report.trimmed > 0  # the old creates and updates went
    catalog, n = load_catalog(s), names(s, "things")
    positions = {
        r["_key"]: r["_source_position"] for r in catalog.load_table(n.tombstones).scan().to_arrow().to_pylist()
    }
    assert positions == {'{"id":1}': [103], '{"id":2}': [106]}
    result = verify(spark, catalog, n, policy_of(s), NOW)
    assert result.ok, (result.counts, result.samples)

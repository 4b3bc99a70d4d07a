"""The benchmark at N = 20k so it cannot rot: every system must end with the model's live
rows (run_once asserts it). Timing is printed by the benchmark, never asserted here."""

import pytest

from connector.core.config import load_settings
from iceberg.catalog import load_catalog
from tests.bench.__main__ import main

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


@pytest.mark.slow
def test_benchmark_smoke(spark, work_root, tmp_path):
    figs = main(
        [
            "--events",
            "20000",
            "--keys",
            "2000",
            "--batch",
            "5000",
            "--incremental",
            "--rounds",
            "2",
            "--no-warmup",
            "--kafka",
            "--repeat",
            "2",
            "--out",
            str(tmp_path),
            "--lake",
            str(work_root),
        ]
    )
    fig = figs[0]
    assert fig["events"] >= 20000 and fig["duckdb_floor_s"] > 0 and fig["kafka_ingest_s"] > 0
    assert len(fig["ours_runs_s"]) == len(fig["naive_merge_runs_s"]) == len(fig["ours_rounds_s"]) == 2
    assert round(fig["ours_s"], 2) in fig["ours_runs_s"] and fig["naive_merge_s"] in fig["naive_merge_runs_s"]
    assert (tmp_path / "results.json").exists() and not list(tmp_path.glob("n*-k*")), "a run's inputs are left on disk"
    catalog = load_catalog(load_settings(work_dir=work_root))
    left = [t for (ns, *_) in catalog.list_namespaces() if ns.startswith("bench_") for t in catalog.list_tables(ns)]
    assert not left, "a run's tables are left in the lake"


@pytest.mark.slow
def test_freshness_smoke(tmp_path):
    """A small steady stream over two tables (a hot and a quiet one, read by topics_pattern)
    through `cdclake run --every` in a process of its own: every event reaches the state, and
    each table ends with the producer's live keys (run_rate asserts it)."""
    from tests.bench.freshness import main as freshness

    args = ["--rates", "1000", "--seconds", "8", "--keys", "3000", "--tables", "2", "--partitions", "2"]
    (fig,) = freshness([*args, "--out", str(tmp_path)])
    assert fig["events"] >= 7000 and fig["not_reached"] == 0 and fig["reached"] == fig["events"]
    assert 0 < fig["p50_s"] <= fig["p99_s"] <= fig["max_s"]
    assert fig["worst_p99_s"] == max(fig["hot_p99_s"], fig["quiet_p99_s"]) <= fig["worst_max_s"] == fig["max_s"]
    assert (tmp_path / "freshness.json").exists() and (tmp_path / "freshness.png").exists()

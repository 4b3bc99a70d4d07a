"""The benchmark at N = 20k so it cannot rot: every system must end with the model's live
rows (run_once asserts it). Timing is printed by the benchmark, never asserted here."""

import pytest

from tests.bench.__main__ import main

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


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

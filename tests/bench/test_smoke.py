"""The benchmark at N = 20k so it cannot rot: every system must end with the model's live
rows (run_once asserts it). Timing is printed by the benchmark, never asserted here."""

import pytest

from tests.bench.__main__ import main

pytestmark = pytest.mark.spark


def test_benchmark_smoke(spark, work_root, tmp_path):
    figs = main(["--events", "20000", "--keys", "2000", "--batch", "5000", "--incremental", "--no-warmup",
                 "--out", str(tmp_path), "--lake", str(work_root)])
    assert figs[0]["events"] >= 20000 and figs[0]["duckdb_floor_s"] > 0

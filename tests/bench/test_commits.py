"""The commit benchmark at a few snapshots so it cannot rot (no Spark: pyiceberg and the SQLite
catalog). Timing is printed by the benchmark, never asserted here."""

import json

from tests.bench.commits import main


def test_the_commit_benchmark_times_both_commits_at_each_count_of_snapshots(tmp_path):
    figs = main(["--snapshots", "9", "4", "--repeat", "1", "--out", str(tmp_path)])
    assert [f["snapshots"] for f in figs] == [4, 9]  # one snapshot a commit, three commits a repetition
    for f in figs:
        assert len(f["pyiceberg_runs_s"]) == 1 and len(f["product_runs_s"]) == 2
        assert f["pyiceberg_s"] in f["pyiceberg_runs_s"] and f["product_s"] in f["product_runs_s"]
        assert f["product_s"] > 0
    assert json.loads((tmp_path / "commits.json").read_text()) == figs
    assert [p.name for p in tmp_path.iterdir()] == ["commits.json"], "the benchmark's lake is left on disk"

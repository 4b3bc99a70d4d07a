"""The benchmark's summary of repeated runs (pure: no Spark)."""

from tests.bench.__main__ import median_run, spread


def test_the_median_run_is_the_one_with_the_median_total():
    runs = [(5.0, 9.0), (7.0, 3.0), (4.0, 4.0)]  # totals 14, 10, 8
    assert median_run(runs) == (7.0, 3.0)
    assert median_run(runs[:2]) == (5.0, 9.0)  # of an even count, the higher one
    assert median_run([(1.0, 2.0)]) == (1.0, 2.0)


def test_spread_shows_the_range_only_for_repeated_runs():
    assert spread({"ours_s": 10.0, "ours_runs_s": [14.0, 10.0, 8.0]}, "ours") == "10.0 (8.0 - 14.0)"
    assert spread({"naive_merge_s": 20.0, "naive_merge_runs_s": [20.0]}, "naive_merge") == "20.0"

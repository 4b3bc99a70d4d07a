"""The benchmark's summary of repeated runs (pure: no Spark)."""

from tests.bench.__main__ import median_run, spread
from tests.bench.freshness import ranged, summarize


def test_the_median_run_is_the_one_with_the_median_total():
    runs = [(5.0, 9.0), (7.0, 3.0), (4.0, 4.0)]  # totals 14, 10, 8
    assert median_run(runs) == (7.0, 3.0)
    assert median_run(runs[:2]) == (5.0, 9.0)  # of an even count, the higher one
    assert median_run([(1.0, 2.0)]) == (1.0, 2.0)


def test_spread_shows_the_range_only_for_repeated_runs():
    assert spread({"ours_s": 10.0, "ours_runs_s": [14.0, 10.0, 8.0]}, "ours") == "10.0 (8.0 - 14.0)"
    assert spread({"naive_merge_s": 20.0, "naive_merge_runs_s": [20.0]}, "naive_merge") == "20.0"


def test_a_rates_runs_summarize_to_medians_with_their_range():
    def run(p99, sustained=True, **more):
        fig = {"rate": 20_000, "seconds": 120, "keys": 10, "p50_s": p99 / 2, "p99_s": p99, "sustained": sustained}
        return {**fig, **more}

    fig = summarize([run(40.0), run(60.0, sustained=False), run(30.0)])
    assert (fig["p99_s"], fig["p50_s"], fig["sustained"]) == (40.0, 20.0, False)
    assert ranged(fig, "p99_s") == "40.0 (30.0 - 60.0)" and ranged(fig, "max_s") == "-"
    assert summarize([run(30.0), run(50.0)])["p99_s"] == 50.0  # of an even count, the higher one
    one = summarize([run(30.0, lag_slope=0.01)])
    assert ranged(one, "p99_s") == "30.0" and one["lag_slope"] == 0.01 and one["sustained"]

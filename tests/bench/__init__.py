"""Benchmark: this pipeline against the baselines a user would write, on one generated stream.

    .venv/bin/python -m tests.bench --events 1000000 --keys 10000 [--scaling] [--big]

Not collected by pytest (no test_ prefix); tests/bench/test_smoke.py runs a small one.
"""

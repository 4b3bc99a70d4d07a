"""History (SCD type 2) from the log against the model's versions of each key (tests/model.py
`versions`): random streams with stale events, snapshots, deletes and their tombstones, under
both orderings; `valid_to` is the next version's `valid_from`; `--write` materializes it."""

from __future__ import annotations

import itertools
import random

import pytest
from typer.testing import CliRunner

from iceberg.history import history
from tests.iceberg.helpers import decoded, names, run_ingest, with_source, write_lines
from tests.iceberg.test_property import to_lines
from tests.model import versions

pytestmark = pytest.mark.spark
OPS = ["c", "u", "u", "d", "r", "c", "u", "d"]


@pytest.mark.parametrize("seed,ordering", list(itertools.product(range(3), ["source", "log"])))
def test_history_is_the_models_versions_of_each_key(spark, settings, tmp_path, seed, ordering):
    rng = random.Random(seed)
    stream = [(rng.randrange(4), rng.choice(OPS), rng.randrange(1, 9), rng.random() < 0.7) for _ in range(40)]
    path = write_lines(tmp_path / "in.jsonl", to_lines(stream, ordering))
    s = with_source(settings, path, ordering=ordering)
    run_ingest(s)
    rows = history(spark, names(s, "things"), ordering).collect()
    got: dict[str, list[tuple[str, str]]] = {}
    for r in rows:
        got.setdefault(r["_key"], []).append((r["_offset"], r["_op"]))
    assert got == versions(decoded(path, s), ordering)
    for a, b in zip(rows, rows[1:]):  # each version ends where the key's next begins
        assert a["valid_to"] == (b["valid_from"] if a["_key"] == b["_key"] else None)
        assert a["is_current"] == (a["_key"] != b["_key"])
    assert all((r["after"] is None) == (r["_op"] == "d") for r in rows)

    if seed == 0 and ordering == "source":
        from connector.cli import app

        env = {"CDCLAKE_WORK_DIR": str(s.work_dir), "CDCLAKE_CATALOG__NAMESPACE": s.catalog.namespace,
               "CDCLAKE_SOURCE__PATH": str(path)}  # fmt: skip
        result = CliRunner().invoke(app, ["history", "things", "--write"], env=env)
        assert result.exit_code == 0, result.output
        written = spark.sql(f"SELECT count(*) FROM {s.catalog.namespace}.things__history").first()[0]
        assert written == len(rows)

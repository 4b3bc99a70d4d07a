"""An ingest commit's cost by the snapshots its table holds.

    python -m tests.bench.commits [--snapshots 24 114 314 1014 1814] [--repeat 5]

One log table of the embedded SQLite catalog grows one snapshot per commit. At each count,
`--repeat` times: pyiceberg's own commit (the table loaded by pyiceberg's `SqlCatalog`, an
empty append carrying the positions) against the product's (`log_writer.commit_data_files`
on the table object kept from commit to commit, through `compat.without_retries` and the
product's catalog, as `connector.sinks.Sinks` commits a batch), two of the product's per
pyiceberg's. Prints the median ms of each with its range; `commits.json` under `--out`.
A table keeps its snapshots for the snapshot retention (an hour by default: 1,800 at a batch
every 2 s).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from pyiceberg.catalog.sql import SqlCatalog
from rich.console import Console
from rich.table import Table

from connector.core.config import load_settings
from iceberg import compat
from iceberg.catalog import load_catalog
from iceberg.layouts import LOG_SCHEMA, LOG_SUFFIX
from iceberg.log_writer import commit_data_files
from iceberg.summary_keys import POSITIONS

console = Console(width=120)
NAMESPACE, NAME = "bench_commits", "events" + LOG_SUFFIX


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m tests.bench.commits", description=__doc__)
    ap.add_argument("--snapshots", type=int, nargs="+", default=[24, 114, 314, 1014, 1814])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("bench-results/commits"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    figs = []
    with tempfile.TemporaryDirectory(dir=args.out) as lake:
        ours = load_catalog(load_settings(work_dir=lake, catalog={"namespace": NAMESPACE}))
        theirs = SqlCatalog(ours.name, **ours.properties)
        ours.create_table((NAMESPACE, NAME), LOG_SCHEMA)
        props = POSITIONS.entry({"inventory.items:0": 1, "inventory.items:1": 1})
        table = ours.load_table((NAMESPACE, NAME))

        def product() -> float:
            nonlocal table
            table = compat.without_retries(table)
            started = time.perf_counter()
            commit_data_files(table, [], props, "main")
            return time.perf_counter() - started

        def pyiceberg() -> float:
            own = theirs.load_table((NAMESPACE, NAME))
            started = time.perf_counter()
            own.append(LOG_SCHEMA.empty_table(), snapshot_properties=props)
            return time.perf_counter() - started

        for target in sorted(args.snapshots):
            while len(table.metadata.snapshots) < target - 3 * args.repeat:
                product()
            timed: dict[str, list[float]] = {"pyiceberg": [], "product": []}
            for _ in range(args.repeat):
                timed["pyiceberg"].append(pyiceberg())
                table = ours.load_table((NAMESPACE, NAME))  # after pyiceberg's commit, as a new run loads it
                timed["product"] += [product(), product()]
            fig = {"snapshots": len(table.metadata.snapshots), **{f"{k}_runs_s": v for k, v in timed.items()}}
            for k, v in timed.items():
                fig[f"{k}_s"] = sorted(v)[len(v) // 2]
            figs.append(fig)
            console.print(
                f"{fig['snapshots']:,} snapshots: pyiceberg {1000 * fig['pyiceberg_s']:.0f} ms, "
                f"product {1000 * fig['product_s']:.0f} ms"
            )
    t = Table("snapshots the table holds", "pyiceberg's commit ms", "the product's ms", title="one ingest commit")
    for f in figs:
        t.add_row(f"{f['snapshots']:,}", *[_ms(f[f"{k}_runs_s"], f[f"{k}_s"]) for k in ("pyiceberg", "product")])
    console.print(t)
    (args.out / "commits.json").write_text(json.dumps(figs, indent=1))
    return figs


def _ms(runs: list[float], median: float) -> str:
    return f"{1000 * median:.0f} ({1000 * min(runs):.0f} - {1000 * max(runs):.0f})"


if __name__ == "__main__":
    main()

"""A Kafka backlog drained by `cdclake ingest`: driver memory against the backlog's size.

    python -m tests.bench.backlog --events 2000000 20000000 [--batch 1000000]

For each N: a real local broker (infra/kafka_broker.py) holds N generated Debezium events
on 4 partitions (produced untimed), then `cdclake ingest` runs in a process of its own from
`earliest` (premium tier: the standard tier's 1 GB per partition would stop it); the run
prints its wall time, events/s, and the peak RSS of its Python process and of its JVM
(local mode: driver and executors), then checks the log holds N rows. The resident sizes
after each batch go to `backlog.json` (`trace`: records so far, Python MB, JVM MB).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tests.bench import systems
from tests.bench.__main__ import broker_under
from tests.bench.generate import TOPIC, generate

console = Console(width=160)

# Runs in the child: ingest, then report both peaks (the JVM is the child's own gateway).
CHILD = """
import json, sys, time
from pathlib import Path
from connector.app import run_ingest
from connector.core.config import load_settings
from iceberg.spark import get_spark
def kb(pid, field):  # VmHWM, not ru_maxrss: that one keeps the forking parent's peak across exec
    line = [l for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith(field)][0]
    return int(line.split()[1]) / 1024
s = load_settings(**json.loads(sys.argv[1]))
jvm = []
trace = []
def on_batch(stats):
    if not jvm:
        jvm.append(get_spark(s).sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    trace.append([stats.records, round(kb("self", "VmRSS:")), round(kb(jvm[0], "VmRSS:"))])
t = time.perf_counter()
stats = run_ingest(s, on_batch)
took = time.perf_counter() - t
print(json.dumps({"records": stats.records, "batches": stats.batches, "seconds": took,
                  "python_peak_mb": kb("self", "VmHWM:"), "jvm_peak_mb": kb(jvm[0], "VmHWM:"),
                  "trace": trace}))
"""


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m tests.bench.backlog", description=__doc__)
    ap.add_argument("--events", type=int, nargs="+", default=[2_000_000, 20_000_000])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1_000_000, help="source.batch_size")
    ap.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Spark configuration for the ingest (spark.conf), e.g. spark.driver.extraJavaOptions=-XX:+UseG1GC",
    )
    ap.add_argument("--out", type=Path, default=Path("bench-results/backlog"))
    args = ap.parse_args(argv)
    figs = []
    with broker_under(args.out) as (root, broker):
        for n in args.events:
            src = root / "events.jsonl"
            generate(src, n, args.keys)
            topic = f"{TOPIC}.backlog{n}.{time.time_ns()}"
            systems.produce_to_kafka(broker.bootstrap, topic, src, 4)
            src.unlink()
            conf = {
                "work_dir": str(root / "lake"),
                "catalog": {"namespace": f"backlog_{n}_{time.time_ns()}"},
                # 20M events hold ~1.2 GB per partition before any compaction: over the
                # standard tier's 1 GB, which would (rightly) stop the run
                "quotas": {"default_tier": "premium"},
                "spark": {"master": "local[2]", "conf": dict(kv.split("=", 1) for kv in args.spark_conf)},
                "source": {
                    "type": "kafka",
                    "bootstrap_servers": broker.bootstrap,
                    "topics": [topic],
                    "batch_size": args.batch,
                },
            }
            env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
            done = subprocess.run(
                [sys.executable, "-c", CHILD, json.dumps(conf)], env=env, capture_output=True, text=True
            )
            (root / f"ingest-{n}.log").write_text(done.stderr)
            if done.returncode:
                raise SystemExit(f"ingest of {n:,} events failed; its log: {root / f'ingest-{n}.log'}")
            fig = {"events": n, **json.loads(done.stdout.strip().splitlines()[-1])}
            assert fig["records"] == n, f"ingested {fig['records']:,} of {n:,} events"
            figs.append(fig)
            console.print({k: v for k, v in fig.items() if k != "trace"})
    t = Table(
        "events waiting",
        "batch",
        "batches",
        "s",
        "events/s",
        "Python peak MB",
        "JVM peak MB",
        title="cdclake ingest draining a Kafka backlog (4 partitions)",
    )
    for f in figs:
        t.add_row(
            f"{f['events']:,}",
            f"{args.batch:,}",
            str(f["batches"]),
            f"{f['seconds']:.1f}",
            f"{f['events'] / f['seconds']:,.0f}",
            f"{f['python_peak_mb']:.0f}",
            f"{f['jvm_peak_mb']:.0f}",
        )
    console.print(t)
    (root / "backlog.json").write_text(json.dumps(figs, indent=1))
    return figs


if __name__ == "__main__":
    main()

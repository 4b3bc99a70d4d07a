"""Run the benchmark: `python -m tests.bench --help`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from connector.core.config import load_settings
from tests.bench import systems
from tests.bench.generate import TOPIC, generate, live_keys

console = Console(width=220)  # the figure tables are wide; never wrap them in a log file


def start_broker(workdir: Path):
    """A real single-node broker (infra/kafka_broker.py) on free loopback ports."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "kafka_broker", Path(__file__).parents[2] / "infra" / "kafka_broker.py"
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    shutil.rmtree(workdir, ignore_errors=True)
    return module.KafkaBroker(workdir).start()


@contextmanager
def broker_under(out: Path) -> Iterator[tuple[Path, Any]]:
    """The results folder (made) and a broker with its data under it, stopped after the block."""
    root = out.resolve()
    root.mkdir(parents=True, exist_ok=True)
    broker = start_broker(root / "kafka")
    try:
        yield root, broker
    finally:
        broker.stop()


def jvm_peak_rss_mb(spark) -> float:
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def median_run(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """The (ingest, compaction) run whose total is the median (the higher one of an even count)."""
    return sorted(runs, key=sum)[len(runs) // 2]


def run_once(root: Path, n: int, k: int, args, spark_holder: dict) -> dict:
    work = root / f"n{n}-k{k}"
    work.mkdir(parents=True, exist_ok=True)
    src = work / "events.jsonl"
    n = generate(src, n, k, args.partitions, args.width)
    expected = live_keys(src)
    settings = load_settings(
        work_dir=args.lake or root / "lake",
        catalog={"namespace": f"bench_n{n}_k{k}"},
        source={"type": "file", "path": str(src), "batch_size": args.ingest_batch},
        spark={"master": "local[2]", "driver_memory": args.driver_memory},
    )
    from iceberg.spark import get_spark

    systems.drop_namespace(settings)  # a rerun starts from empty tables, not from the last run's positions

    spark = spark_holder.setdefault("spark", get_spark(settings))
    fig: dict = {"events": n, "keys": k, "partitions": args.partitions, "width": args.width}
    ours_runs, naive_runs = [], []
    for i in range(args.repeat if n <= args.repeat_max else 1):  # interleaved: both see the same machine
        if i:
            systems.drop_namespace(settings)
            console.print(
                f"repeat {i + 1} of {args.repeat} (last run: ours {sum(ours_runs[-1]):.1f} s, "
                f"naive MERGE {naive_runs[-1]:.1f} s)"
            )
        _, ingest_s = timed(systems.ours_ingest, settings)
        _, compact_s = timed(systems.ours_compact, settings)
        systems.check_live(settings, "items", "_key", expected, src, "this pipeline")
        ours_runs.append((ingest_s, compact_s))
        if not i:  # this pipeline's own peak; the process peak below also covers the baselines
            fig["python_peak_after_ours_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            fig["jvm_peak_after_ours_mb"] = jvm_peak_rss_mb(spark)
            batches = systems.split_files(src, work / "batches", args.batch)
        _, naive_s = timed(systems.naive_spark_merge, spark, settings, batches, work / "chk")
        systems.check_live(settings, "naive_items", "k", expected, src, "naive MERGE")
        naive_runs.append(naive_s)
    fig["ours_runs_s"], fig["naive_merge_runs_s"] = [round(a + b, 2) for a, b in ours_runs], naive_runs
    fig["ours_ingest_s"], fig["ours_compact_s"] = median_run(ours_runs)
    fig["ours_s"] = fig["ours_ingest_s"] + fig["ours_compact_s"]
    fig["naive_merge_s"] = statistics.median_high(naive_runs)
    ns = settings.catalog.namespace
    for t in ("items__log", "items", "items__tombstones"):
        fig[f"files_{t}"], fig[f"bytes_{t}"] = systems.table_files(settings, f"{ns}.{t}")
    fig["files_naive"], fig["bytes_naive"] = systems.table_files(settings, f"{ns}.naive_items")

    if args.kafka:  # the same events from a real broker, into a namespace of their own
        broker = spark_holder.get("broker") or spark_holder.setdefault("broker", start_broker(root / "kafka"))
        topic = f"{TOPIC}.n{n}k{k}.{time.time_ns()}"
        systems.produce_to_kafka(broker.bootstrap, topic, src, args.partitions)
        from_kafka = settings.model_copy(
            update={
                "catalog": settings.catalog.model_copy(update={"namespace": f"bench_kafka_n{n}_k{k}"}),
                "source": load_settings(
                    source={
                        "type": "kafka",
                        "bootstrap_servers": broker.bootstrap,
                        "topics": [topic],
                        "batch_size": args.ingest_batch,
                    }
                ).source,
            }
        )
        kafka_runs = []
        for _ in range(args.repeat if n <= args.repeat_max else 1):  # as many runs as the file's ingest
            systems.drop_namespace(from_kafka)
            kafka_runs.append(timed(systems.ours_ingest, from_kafka)[1])
            assert systems.log_rows(from_kafka) == n, "the log from Kafka does not hold every event once"
        fig["kafka_ingest_runs_s"], fig["kafka_ingest_s"] = kafka_runs, statistics.median_high(kafka_runs)
        systems.ours_compact(from_kafka)
        systems.check_live(from_kafka, "items", "_key", expected, src, "the tables from Kafka")

    if n <= args.upsert_max:
        _, fig["pyiceberg_upsert_s"] = timed(systems.pyiceberg_upsert, settings, src, args.batch)
        systems.check_live(settings, "upsert_items", "k", expected, src, "pyiceberg upsert")
    parquet = systems.to_parquet(src, work / "events.parquet")
    con, fig["duckdb_floor_s"] = timed(systems.duckdb_floor, parquet)
    assert systems.duckdb_live(con) == expected, "DuckDB disagrees with the model"

    if args.incremental:  # compaction grows with dirty bytes, not with the clean table (nor its history)
        more = max(n // 100, 1000)
        extra = work / "more.jsonl"
        last = {}
        for line in src.open():
            r = json.loads(line)
            last[r["partition"]] = r["offset"]
        rounds = []
        for i in range(args.rounds):
            generate(extra, more, k * 10, args.partitions, args.width, seed=2 + i, lsn0=10 * n * (i + 1))  # newer
            with src.open("a") as f:  # same topic, offsets continue per partition
                for line in extra.open():
                    r = json.loads(line)
                    last[r["partition"]] += 1
                    r["offset"], r["topic"] = last[r["partition"]], TOPIC
                    f.write(json.dumps(r) + "\n")
            systems.ours_ingest(settings)
            rounds.append(round(timed(systems.ours_compact, settings)[1], 2))
            if args.rounds > 1:
                console.print(f"incremental round {i + 1} of {args.rounds}: compaction {rounds[-1]:.2f} s")
        systems.check_live(settings, "items", "_key", live_keys(src), src, "the incremental rounds")
        fig["ours_incremental_compact_s"], fig["incremental_events"] = rounds[0], more
        fig["ours_rounds_s"] = rounds

    fig["python_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    fig["jvm_peak_rss_mb"] = jvm_peak_rss_mb(spark)
    fig["events_per_s"] = n / fig["ours_s"]
    fig["compaction_events_per_s"] = n / fig["ours_compact_s"]
    if not args.keep_inputs:  # a 10M run's stream, batches and Parquet take ~8 GB; the grid would take ~25 GB
        shutil.rmtree(work)
        systems.drop_namespace(settings)  # and its tables and topic: ~15 GB more over a grid
        if args.kafka:
            systems.drop_namespace(from_kafka)
            systems.delete_topic(spark_holder["broker"].bootstrap, topic)
    return fig


def spread(f: dict, system: str) -> str:
    """The median, and the range of the repeated runs when there were several."""
    runs = f.get(f"{system}_runs_s", [])
    median = f"{f[f'{system}_s']:.1f}"
    return f"{median} ({min(runs):.1f} - {max(runs):.1f})" if len(runs) > 1 else median


def report(figs: list[dict]) -> None:
    t = Table(
        "N",
        "K",
        "ours s (runs)",
        "ingest s",
        "compact s",
        "events/s",
        "naive MERGE s (runs)",
        "pyiceberg upsert s",
        "DuckDB floor s",
        "naive/ours",
        "upsert/ours",
        "compact/DuckDB",
        "JVM peak MB ours/all",
        "Python peak MB ours/all",
        title="end to end on one generated stream (same live rows checked)",
    )
    for f in figs:
        up = f.get("pyiceberg_upsert_s")
        t.add_row(
            f"{f['events']:,}",
            f"{f['keys']:,}",
            spread(f, "ours"),
            f"{f['ours_ingest_s']:.1f}",
            f"{f['ours_compact_s']:.1f}",
            f"{f['events_per_s']:,.0f}",
            spread(f, "naive_merge"),
            f"{up:.1f}" if up else "skipped",
            f"{f['duckdb_floor_s']:.2f}",
            f"{f['naive_merge_s'] / f['ours_s']:.2f}",
            f"{up / f['ours_s']:.2f}" if up else "-",
            f"{f['ours_compact_s'] / f['duckdb_floor_s']:.1f}",
            f"{f['jvm_peak_after_ours_mb']:.0f} / {f['jvm_peak_rss_mb']:.0f}",
            f"{f['python_peak_after_ours_mb']:.0f} / {f['python_peak_rss_mb']:.0f}",
        )
    console.print(t)
    files = Table(
        "N",
        "K",
        "log files/MB",
        "state files/MB",
        "tombstone files/MB",
        "naive files/MB",
        "incremental compact s (events)",
        title="files and bytes per table after the run",
    )
    for f in figs:

        def mb(name: str, f: dict = f) -> str:
            return f"{f[f'files_{name}']} / {f[f'bytes_{name}'] / 2**20:.1f}"

        inc = f.get("ours_incremental_compact_s")
        files.add_row(
            f"{f['events']:,}",
            f"{f['keys']:,}",
            mb("items__log"),
            mb("items"),
            mb("items__tombstones"),
            mb("naive"),
            f"{inc:.1f} ({f['incremental_events']:,})" if inc else "-",
        )
    console.print(files)
    for f in figs:
        if f.get("kafka_ingest_s"):
            file_s, kafka_s = f["ours_ingest_s"], f["kafka_ingest_s"]
            console.print(
                f"N={f['events']:,} K={f['keys']:,}: ingest from the file {file_s:.1f} s "
                f"({f['events'] / file_s:,.0f} events/s), from Kafka {kafka_s:.1f} s "
                f"({f['events'] / kafka_s:,.0f} events/s): Kafka / file {kafka_s / file_s:.2f}"
            )
    for f in figs:
        rounds = f.get("ours_rounds_s", [])
        if len(rounds) > 1:
            tenth = max(1, len(rounds) // 10)
            console.print(
                f"N={f['events']:,} K={f['keys']:,}: {len(rounds)} incremental rounds of "
                f"{f['incremental_events']:,} events: compaction median {statistics.median(rounds):.2f} s, "
                f"first {tenth} {statistics.mean(rounds[:tenth]):.2f} s, last {tenth} "
                f"{statistics.mean(rounds[-tenth:]):.2f} s (mean), max {max(rounds):.2f} s"
            )
    for f in figs:
        # the DuckDB floor is reported, not a target: the pipeline's only engine is Spark
        checks = [("naive MERGE per micro-batch >= 2x slower", f["naive_merge_s"] / f["ours_s"] >= 2)]
        if f.get("pyiceberg_upsert_s") and f["keys"] >= 1_000_000:
            checks.append(("pyiceberg upsert >= 10x slower", f["pyiceberg_upsert_s"] / f["ours_s"] >= 10))
        checks.append(("ingest from the file >= 185k events/s", f["events"] / f["ours_ingest_s"] >= 185_000))
        if f.get("kafka_ingest_s"):
            checks.append(
                ("ingest from Kafka within 1.5x of the file's", f["kafka_ingest_s"] <= 1.5 * f["ours_ingest_s"])
            )
        if f["events"] >= 10_000_000 and f["keys"] >= 1_000_000:
            checks.append(("10M events / 1M keys end to end < 40 s", f["ours_s"] < 40))
        if f.get("ours_rounds_s") and f["keys"] >= 1_000_000 and f["incremental_events"] <= 10_000:
            warm = statistics.median(f["ours_rounds_s"])
            checks.append(("a warm round of 10k events into 1M keys <= 2.0 s (median)", warm <= 2.0))
        for name, ok in checks:
            console.print(
                f"N={f['events']:,} K={f['keys']:,}: target {name}: "
                + ("[green]holds[/green]" if ok else "[red]missed[/red]")
            )


def chart(figs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len({f["keys"] for f in figs}), figsize=(11, 4), squeeze=False)
    for ax, k in zip(axes[0], sorted({f["keys"] for f in figs})):
        rows = sorted((f for f in figs if f["keys"] == k), key=lambda f: f["events"])
        for key, label in (
            ("ours_s", "this pipeline"),
            ("naive_merge_s", "naive MERGE per micro-batch"),
            ("pyiceberg_upsert_s", "pyiceberg upsert"),
            ("duckdb_floor_s", "DuckDB floor (dedupe)"),
        ):
            pts = [(f["events"], f[key]) for f in rows if f.get(key)]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label)
        ax.set_title(f"K = {k:,} keys")
        ax.set_xlabel("events")
        ax.set_ylabel("seconds")
        ax.grid(True, alpha=0.3)
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--width", type=int, default=100, help="payload padding in bytes")
    ap.add_argument("--batch", type=int, default=100_000, help="micro-batch size of the baselines")
    ap.add_argument("--ingest-batch", type=int, default=1_000_000, help="records per ingest commit of this pipeline")
    ap.add_argument("--upsert-max", type=int, default=1_000_000, help="skip pyiceberg upsert above this N")
    ap.add_argument("--scaling", action="store_true", help="N = 1M, 5M (and 10M with --big) x K = 10k, 1M")
    ap.add_argument("--big", action="store_true", help="include the 10M runs")
    ap.add_argument("--incremental", action="store_true", help="then compact 1%% new events into the result")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --incremental: this many rounds of 1%% new events each, one after the other (does "
        "a round cost more the more rounds came before it?)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="run this pipeline and naive MERGE this many times, interleaved, at N <= --repeat-max, "
        "and report each one's median (single runs varied by up to 50%% on a 2-core machine)",
    )
    ap.add_argument("--repeat-max", type=int, default=1_000_000)
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument(
        "--no-warmup",
        action="store_true",
        help="time the first runs in a cold JVM (default: every system runs once on 100k events first)",
    )
    ap.add_argument(
        "--keep-inputs",
        action="store_true",
        help="keep each run's generated stream, batches and Parquet under <out>, its tables in the lake "
        "and its Kafka topic (default: removed after the run)",
    )
    ap.add_argument(
        "--kafka",
        action="store_true",
        help="also ingest the same events from a local Kafka broker (infra/kafka_broker.py)",
    )
    ap.add_argument(
        "--tables",
        type=int,
        help="instead of the grid: this many tables x --table-events events against one table of as many "
        "events, ingest and compaction in one run, and a pass over the tables with nothing due",
    )
    ap.add_argument("--table-events", type=int, default=2_000, help="with --tables: events per table")
    ap.add_argument("--table-keys", type=int, default=500, help="with --tables: keys per table")
    ap.add_argument(
        "--cli",
        action="store_true",
        help="with --tables: also run the ingest and the compaction as a user runs them, each command "
        "(cdclake ingest, cdclake compact --force) a process of its own, its start-up included",
    )
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    ap.add_argument("--lake", type=Path, help="work dir of the catalog (default <out>/lake)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: run each system at least once")
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: at least one incremental round")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("iceberg.compaction.job").setLevel(logging.INFO)  # where a round's time goes, step by step
    os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)
    root = args.out.resolve()
    grid = [(args.events, args.keys)]
    if args.scaling:
        grid = [
            (n, k)
            for k in (10_000, 1_000_000)
            for n in (1_000_000, 5_000_000, 10_000_000)
            if n < 10_000_000 or args.big
        ]
    if args.tables:
        return [_tables(root, args)]
    holder: dict = {}
    figs: list[dict] = []
    try:
        if not args.no_warmup:  # the JVM compiles its hot paths on first use; no system should pay that alone
            console.rule("warm-up: every system once on up to 100,000 events (not reported)")
            warm = min(args.events, 100_000)
            run_once(
                root,
                warm,
                min(args.keys, warm // 10),
                argparse.Namespace(**{**vars(args), "incremental": False, "repeat": 1}),
                holder,
            )
        for n, k in grid:
            console.rule(f"N = {n:,}, K = {k:,}")
            figs.append(run_once(root, n, k, args, holder))
            (root / "results.json").write_text(json.dumps(figs, indent=1))
    finally:
        if "broker" in holder:
            holder.pop("broker").stop()
    report(figs)
    if len(figs) > 1:
        chart(figs, root / "scaling.png")
        console.print(f"chart: {root / 'scaling.png'}")
    console.print(f"figures: {root / 'results.json'}")
    return figs


def _tables(root: Path, args) -> dict:
    from tests.bench import tables

    if not args.no_warmup:
        console.rule("warm-up: 2 tables x 1,000 events (not reported)")
        warm = {"tables": 2, "table_events": 1000, "repeat": 1, "cli": False}
        tables.run(root, argparse.Namespace(**{**vars(args), **warm}), console)
    console.rule(f"{args.tables} tables x {args.table_events:,} events against one table")
    fig = tables.run(root, args, console)
    (root / f"tables{args.tables}.json").write_text(json.dumps(fig, indent=1))
    tables.report(fig, console)
    return fig


if __name__ == "__main__":
    main()

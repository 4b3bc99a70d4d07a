"""Freshness under a steady stream: how long an event takes to reach the compacted table.

    python -m tests.bench.freshness --rates 5000 20000 50000 --seconds 120

For each rate: a real local broker (infra/kafka_broker.py) gets a new topic of 4 partitions;
a create for each of `--keys` keys is produced and compacted first (the table holds them all
before the clock starts); then a producer in this process writes Debezium changes (updates,
about 10% deletes with their tombstones, re-creates) at the rate, for `--seconds`, while
`cdclake run --every 1` runs in a process of its own (`local[2]`, every round compacting what
it ingested: `min_cleanable_dirty_ratio = 0`).

An event's latency is the time from its produce timestamp (its Kafka timestamp, set by this
producer) to the commit time of the first state snapshot whose cleaner point for its
partition is past its offset (every event below a cleaner point is in that snapshot). The
run reports p50 / p95 / p99 / max per rate, and whether the job sustains the rate: the lag
does not grow, i.e. the slope of latency against produce time stays under 0.1 s per s (a
job that keeps up with 90% of the rate or more). The producer shares the 2 cores with the
job. At the end the state must hold exactly the keys the producer left alive. With
`--repeat N` every rate runs N times, the rates interleaved, and each figure is the median of
its runs, shown with their range; a rate counts as sustained only if every run sustained it.

With `--tables N` (say `--tables 100 --rates 5000 --keys 100000 --partitions 2`) the stream is
a database's: N tables (t000, t001, ...), a topic each, read by `topics_pattern`; 80% of the
events go to 10% of the tables (the hot ones), the rest spread over the quiet ones. Each
table's latencies are taken from its own state snapshots; the run prints p50 over all,
p99 of the hot and of the quiet tables' events, the worst table's p99 and the worst lag of
any event, and checks every table against the producer's model.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from array import array
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from tests.bench.__main__ import broker_under
from tests.bench.generate import TOPIC

console = Console(width=160)
PARTITIONS = 4
# with --tables N: this share of the events goes to this share of the tables (the hot ones)
HOT_SHARE, HOT_TABLES = 0.8, 0.1
SUSTAINED_SLOPE = 0.1  # seconds of latency gained per second of stream


def event(k: int, lsn: int, op: str, width: int, table: str = "items") -> bytes:
    after = None if op == "d" else {"id": k, "v": lsn, "pad": "x" * width}
    return json.dumps(
        {
            "op": op,
            "before": None,
            "after": after,
            "ts_ms": int(time.time() * 1000),
            "source": {"connector": "postgresql", "table": table, "lsn": lsn},
        },
        separators=(",", ":"),
    ).encode()


def producer(bootstrap: str, topics: list[str], partitions: int):
    """A producer, once `topics` exist (made here with `partitions` each)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the topics exist
    for f in admin.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
        f.result(60)
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "enable.idempotence": True})


class Stream:
    """The changes of one table into its topic, remembering each record's timestamp by
    partition (the offsets of a new topic from one producer are 0, 1, 2, ... in produce
    order) and which keys are alive (the model of the compacted table)."""

    def __init__(self, producer, topic: str, width: int, seed: int = 1, table: str = "items", partitions: int = 4):
        self.producer, self.topic, self.table, self.width = producer, topic, table, width
        self.rng, self.partitions = random.Random(seed), partitions
        self.ts = [array("q") for _ in range(partitions)]
        self.alive: set[int] = set()
        self.lsn = 1000

    def _send(self, k: int, value: bytes | None, now_ms: int) -> None:
        p = k % self.partitions
        while True:
            try:
                self.producer.produce(self.topic, key=b'{"id":%d}' % k, value=value, partition=p, timestamp=now_ms)
                break
            except BufferError:
                self.producer.poll(0.05)
        self.ts[p].append(now_ms)

    def change(self, k: int, now_ms: int) -> None:
        self.lsn += 1
        if k in self.alive and self.rng.random() < 0.1:
            self.alive.discard(k)
            self._send(k, event(k, self.lsn, "d", self.width, self.table), now_ms)
            self._send(k, None, now_ms)  # the tombstone
        else:
            self._send(k, event(k, self.lsn, "u" if k in self.alive else "c", self.width, self.table), now_ms)
            self.alive.add(k)

    def produced(self) -> int:
        return sum(len(t) for t in self.ts)

    def latencies(self, catalog, ns: str, first: list[int]) -> tuple[np.ndarray, np.ndarray, int]:
        return latencies(cleaner_history(catalog, f"{ns}.{self.table}"), self.topic, self.ts, first)

    def behind(self, catalog, ns: str) -> bool:
        return behind(cleaner_history(catalog, f"{ns}.{self.table}"), self.topic, [len(t) for t in self.ts])


def cleaner_history(catalog, state: str) -> list[tuple[int, dict[str, int]]]:
    """(commit time in ms, cleaner points) of each state snapshot that carries them, in order."""
    from iceberg.summary_keys import CLEANER_POINTS

    try:
        table = catalog.load_table(state)
    except Exception:  # noqa: BLE001 - not created yet
        return []
    out = []
    for s in sorted(table.snapshots(), key=lambda s: s.timestamp_ms):
        points = CLEANER_POINTS.of(s)
        if points is not None:
            out.append((s.timestamp_ms, points))
    return out


def behind(history: list[tuple[int, dict[str, int]]], topic: str, produced: list[int]) -> bool:
    """Whether the newest state snapshot misses some of `produced` (records per partition)."""
    points = history[-1][1] if history else {}
    return any(points.get(f"{topic}:{p}", 0) < n for p, n in enumerate(produced))


def latencies(history, topic: str, ts: list[array], first: list[int]) -> tuple[np.ndarray, np.ndarray, int]:
    """Per steady event (offset >= first[p]) reached by a snapshot: its produce time (s since
    the epoch) and its latency (s); and how many no snapshot reached."""
    produced, lat, missing = [], [], 0
    for p in range(len(ts)):
        t = np.frombuffer(ts[p], dtype=np.int64)
        done = first[p]
        for commit_ms, points in history:
            end = min(points.get(f"{topic}:{p}", 0), len(t))
            if end > done:
                produced.append(t[done:end])
                lat.append(commit_ms - t[done:end])
                done = end
        missing += len(t) - done
    at = np.concatenate(produced) if produced else np.array([], np.int64)
    return at / 1000, np.concatenate(lat) / 1000 if lat else at, missing


def _streams(producer, prefix: str, args) -> list[Stream]:
    """One table's stream into topic `prefix`, or with `--tables N` N tables' (t000, t001, ...)
    into `prefix.t000`, ..."""
    if args.tables == 1:
        return [Stream(producer, prefix, args.width, partitions=args.partitions)]
    return [
        Stream(producer, f"{prefix}.t{i:03d}", args.width, seed=i + 1, table=f"t{i:03d}", partitions=args.partitions)
        for i in range(args.tables)
    ]


def _wait(streams: list[Stream], catalog, ns: str, job, limit: float) -> bool:
    """Waits up to `limit` s for every stream's events to be compacted (False: some are not)."""
    left, started = list(streams), time.monotonic()
    while left and time.monotonic() - started < limit and job.poll() is None:
        left = [s for s in left if s.behind(catalog, ns)]
        if left:
            time.sleep(1 if len(streams) == 1 else 3)
    return not left


def run_rate(broker, root: Path, rate: int, args) -> dict:
    from connector.core.config import load_settings
    from iceberg.catalog import load_catalog

    stamp = time.time_ns()
    prefix, ns = f"{TOPIC}.fresh{rate}.{stamp}", f"fresh_{rate}_{stamp}"
    topics = (
        f"topics = [{json.dumps(prefix)}]"
        if args.tables == 1
        else f"topics_pattern = {json.dumps(re.escape(prefix) + '[.].*')}"
    )
    config = root / f"fresh-{rate}.toml"
    config.write_text(
        f"work_dir = {json.dumps(str(root / 'lake'))}\n"
        f'[catalog]\nnamespace = "{ns}"\n'
        f'[source]\ntype = "kafka"\nbootstrap_servers = "{broker.bootstrap}"\n{topics}\n'
        '[spark]\nmaster = "local[2]"\n'
        f"[compaction]\nmin_cleanable_dirty_ratio = {args.min_dirty_ratio}\n"
    )
    catalog = load_catalog(load_settings(config))
    names = [f"{prefix}.t{i:03d}" for i in range(args.tables)] if args.tables > 1 else [prefix]
    streams = _streams(producer(broker.bootstrap, names, args.partitions), prefix, args)
    producing = streams[0].producer
    keys = args.keys // len(streams)  # per table
    hot = streams[: max(1, round(len(streams) * HOT_TABLES))]
    quiet = streams[len(hot) :]
    now = int(time.time() * 1000)
    for stream in streams:  # the tables' keys, before the clock starts
        for k in range(keys):
            stream.change(k, now)
            if k % 10_000 == 0:
                producing.poll(0)
    if producing.flush(120):
        raise RuntimeError("the producer could not deliver every seed event to the broker")
    seeded = {s.topic: [len(t) for t in s.ts] for s in streams}
    log = (root / f"fresh-{rate}.log").open("w")
    job = subprocess.Popen(
        [sys.executable, "-m", "connector.cli", "run", "-c", str(config), "--every", str(args.every)],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        started = time.monotonic()
        if not _wait(streams, catalog, ns, job, 900):
            raise SystemExit(f"the job did not compact the {keys * len(streams):,} seed keys; its log: {log.name}")
        console.print(
            f"rate {rate:,}/s: {keys * len(streams):,} keys in {len(streams)} tables compacted "
            f"in {time.monotonic() - started:.0f} s; streaming"
        )
        pick = random.Random(0)
        t0, sent = time.monotonic(), 0
        while (elapsed := time.monotonic() - t0) < args.seconds:
            due = int(rate * elapsed)
            now = int(time.time() * 1000)
            while sent < due:  # HOT_SHARE of the events to the hot tables (all of them to one table)
                group = hot if not quiet or pick.random() < HOT_SHARE else quiet
                stream = group[pick.randrange(len(group))]
                stream.change(stream.rng.randrange(keys), now)
                sent += 1
            producing.poll(0)
            time.sleep(0.005)
        achieved = sent / (time.monotonic() - t0)
        if producing.flush(120):
            raise RuntimeError("the producer could not deliver every event to the broker")
        _wait(streams, catalog, ns, job, args.drain)
    finally:
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(120)
        except subprocess.TimeoutExpired:
            job.kill()
        log.close()
    fig = {"rate": rate, "achieved_rate": round(achieved), "seconds": args.seconds, "keys": args.keys}
    fig["tables"] = len(streams)
    fig["events"] = sum(sum(len(t) for t in s.ts) - sum(seeded[s.topic]) for s in streams)
    per = {s.table: s.latencies(catalog, ns, seeded[s.topic]) for s in streams}
    at = np.concatenate([a for a, _, _ in per.values()])
    lat = np.concatenate([la for _, la, _ in per.values()])
    missing = sum(m for _, _, m in per.values())
    fig["reached"], fig["not_reached"] = int(len(lat)), missing
    fig["rounds"] = statistics.median_high(rounds(catalog, ns, s, seeded[s.topic]) for s in streams)
    if len(lat):
        fig.update({f"p{q}_s": round(float(np.percentile(lat, q)), 2) for q in (50, 95, 99)})
        fig["max_s"] = round(float(lat.max()), 2)
        fig["lag_slope"] = round(float(np.polyfit(at - at.min(), lat, 1)[0]), 3) if len(lat) > 1 else 0.0
    if len(streams) > 1:
        fig["hot_tables"] = len(hot)
        for name, group in (("hot", hot), ("quiet", quiet)):
            mine = [per[s.table][1] for s in group if len(per[s.table][1])]
            if mine:
                fig.update(
                    {f"{name}_p{q}_s": round(float(np.percentile(np.concatenate(mine), q)), 2) for q in (50, 99)}
                )
        p99 = {t: float(np.percentile(la, 99)) for t, (_, la, _) in per.items() if len(la)}
        if p99:
            worst = max(p99, key=p99.__getitem__)
            fig["worst_table"], fig["worst_p99_s"] = worst, round(p99[worst], 2)
            fig["worst_max_s"] = round(max(float(la.max()) for _, la, _ in per.values() if len(la)), 2)
    fig["sustained"] = bool(len(lat)) and missing == 0 and fig["lag_slope"] < SUSTAINED_SLOPE
    if missing == 0:  # each table against the producer's model
        for s in streams:
            live = catalog.load_table(f"{ns}.{s.table}").scan(selected_fields=("_key",)).to_arrow().num_rows
            assert live == len(s.alive), f"{s.table}: the state holds {live:,} keys, the producer left {len(s.alive):,}"
    return fig


def rounds(catalog, ns: str, stream: Stream, first: list[int]) -> int:
    """The table's state snapshots committed while the stream ran."""
    produced = [len(t) for t in stream.ts]
    first_ms = min((stream.ts[p][first[p]] for p in range(len(first)) if produced[p] > first[p]), default=0)
    return sum(1 for ms, _ in cleaner_history(catalog, f"{ns}.{stream.table}") if ms >= first_ms)


FIGURES: tuple[str, ...] = ("achieved_rate", "events", "rounds", "reached", "not_reached")
FIGURES += ("p50_s", "p95_s", "p99_s", "max_s", "lag_slope")
FIGURES += ("hot_p50_s", "hot_p99_s", "quiet_p50_s", "quiet_p99_s", "worst_p99_s", "worst_max_s")


def summarize(runs: list[dict]) -> dict:
    """One rate's runs as one figure: each number the median of the runs that have it (the
    higher one of an even count), sustained only if every run was; the runs kept beside."""
    fig = {k: runs[0][k] for k in ("rate", "seconds", "keys")} | {"tables": runs[0].get("tables", 1)}
    for k in FIGURES:
        if values := [r[k] for r in runs if k in r]:
            fig[k] = statistics.median_high(values)
    fig["sustained"] = all(r["sustained"] for r in runs)
    fig["runs"] = runs
    return fig


def ranged(fig: dict, key: str) -> str:
    """A figure with the range of its runs, where there are several."""
    values = [r[key] for r in fig.get("runs", []) if key in r]
    if key not in fig:
        return "-"
    return f"{fig[key]:.1f}" + (f" ({min(values):.1f} - {max(values):.1f})" if len(values) > 1 else "")


def chart(figs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [f for f in figs if "p50_s" in f]
    fig, ax = plt.subplots(figsize=(7, 4))
    for q, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^-")):
        ax.plot([f["rate"] for f in done], [f[f"{q}_s"] for f in done], style, label=q)
    ax.axhline(15, color="grey", lw=0.8, ls=":", label="p99 target (15 s at 20k/s)")
    ax.set_xscale("log")
    ax.set_xlabel("events/s produced")
    ax.set_ylabel("produce -> compacted table (s)")
    ax.set_title("Freshness under a steady stream, cdclake run --every 1, local[2]")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(
        prog="python -m tests.bench.freshness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--rates", type=int, nargs="+", default=[5_000, 20_000, 50_000], help="events/s")
    ap.add_argument("--seconds", type=float, default=120, help="how long each rate is produced")
    ap.add_argument("--keys", type=int, default=1_000_000, help="keys in all (with --tables N, keys / N a table)")
    ap.add_argument(
        "--tables",
        type=int,
        default=1,
        help=f"spread the stream over N tables, a topic each: {HOT_SHARE * 100:.0f}%% of the events "
        f"to {HOT_TABLES * 100:.0f}%% of them (the hot ones), read by topics_pattern",
    )
    ap.add_argument("--partitions", type=int, default=PARTITIONS, help="partitions of each topic")
    ap.add_argument("--min-dirty-ratio", type=float, default=0.0, help="the job's compaction.min_cleanable_dirty_ratio")
    ap.add_argument("--width", type=int, default=100, help="padding of each row (bytes)")
    ap.add_argument("--every", type=float, default=1.0, help="cdclake run --every")
    ap.add_argument("--drain", type=float, default=120, help="seconds to wait for the last events after the stream")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every rate this many times, the rates interleaved, and report each figure's median and range",
    )
    ap.add_argument("--out", type=Path, default=Path("bench-results/freshness"))
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: run each rate at least once")
    runs: dict[int, list[dict]] = {rate: [] for rate in args.rates}
    with broker_under(args.out) as (root, broker):
        for i in range(args.repeat):
            for rate in args.rates:
                runs[rate].append(run_rate(broker, root, rate, args))
                console.print(f"run {i + 1} of {args.repeat}:", runs[rate][-1])
                figs = [summarize(r) for r in runs.values() if r]
                (root / "freshness.json").write_text(json.dumps(figs, indent=1))
    if args.tables > 1:
        report_tables(figs)
    else:
        report_one(figs)
    chart(figs, root / "freshness.png")
    console.print(f"figures: {root / 'freshness.json'}, chart: {root / 'freshness.png'}")
    return figs


def report_one(figs: list[dict]) -> None:
    t = Table(
        "events/s", "produced/s", "events", "rounds", "p50 s", "p95 s", "p99 s", "max s", "lag slope", "sustained"
    )
    t.title = "freshness: produce -> first state snapshot holding the event (local[2])"
    for f in figs:
        t.add_row(
            f"{f['rate']:,}",
            f"{f['achieved_rate']:,}",
            f"{f['events']:,}",
            str(f["rounds"]),
            *(ranged(f, q) for q in ("p50_s", "p95_s", "p99_s", "max_s")),
            f"{f.get('lag_slope', float('nan')):.3f}",
            "yes" if f["sustained"] else f"no ({f['not_reached']:,} not reached, median)",
        )
    console.print(t)
    at20k = [f for f in figs if f["rate"] == 20_000 and "p99_s" in f]
    if at20k:
        held = at20k[0]["p99_s"] < 15 and at20k[0]["sustained"]
        console.print(f"target p99 < 15 s at 20,000 events/s, sustained: {'held' if held else 'missed'}")


def report_tables(figs: list[dict]) -> None:
    t = Table("events/s", "tables", "events", "rounds a table", "p50 s", "p99 s hot", "p99 s quiet")
    for column in ("worst table p99 s", "worst lag s", "sustained"):
        t.add_column(column)
    t.title = (
        f"freshness over many tables ({HOT_SHARE:.0%} of the events to {HOT_TABLES:.0%} of the tables): produce -> "
        "first state snapshot holding the event (local[2])"
    )
    for f in figs:
        t.add_row(
            f"{f['rate']:,}",
            str(f["tables"]),
            f"{f['events']:,}",
            str(f["rounds"]),
            *(ranged(f, q) for q in ("p50_s", "hot_p99_s", "quiet_p99_s", "worst_p99_s", "worst_max_s")),
            "yes" if f["sustained"] else f"no ({f['not_reached']:,} not reached, median)",
        )
    console.print(t)
    for f in figs:
        if f["tables"] >= 100 and f["rate"] == 5_000 and "worst_p99_s" in f:
            held = f["worst_p99_s"] < 30 and f["sustained"]
            console.print(
                f"target every table's p99 < 30 s over {f['tables']} tables at 5,000 events/s, sustained: "
                + ("held" if held else "missed")
            )


if __name__ == "__main__":
    main()

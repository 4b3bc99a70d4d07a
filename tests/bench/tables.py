"""Many tables against one: N tables x E events, and one table of N x E events, through the
same ingest and compaction in one run (`python -m tests.bench --tables N`). Prints both times,
their ratio, a pass over the N tables when nothing is due, and one after 2% more events come
to every table (below the dirty ratio that makes a round due), and that pass forced (small
rounds into the rows held for their keys); checks every table's live keys against the stream's."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from connector.app import run_compaction, run_ingest
from connector.core.config import Settings, load_settings
from tests.bench import systems
from tests.bench.generate import generate, live_keys

# Targets (docs/performance.md): compaction within 1.5x of one table's, ingest within 1.2x;
# a pass over 200 tables with nothing due under 5 s.
COMPACTION_RATIO, INGEST_RATIO, IDLE_S, IDLE_TABLES = 1.5, 1.2, 5.0, 200
MORE = 0.02  # of each table's events come after its compaction: not due at the default dirty ratio


def _streams(work: Path, tables: int, events: int, keys: int, partitions: int) -> tuple[Path, Path, Path, dict]:
    """The many-table stream (one topic per table, one after the other), what comes next to
    each of its tables (`MORE` of its events), and the one-table stream of as many events over
    as many keys; the live keys of each table before what comes next."""
    work.mkdir(parents=True, exist_ok=True)
    many, more, one, part = work / "many.jsonl", work / "more.jsonl", work / "one.jsonl", work / "part.jsonl"
    expected = {}
    many.unlink(missing_ok=True)
    more.unlink(missing_ok=True)
    for i in range(tables):
        name = f"t{i:03d}"
        generate(part, events + max(1, int(events * MORE)), keys, partitions, seed=10 + i, table=name)
        lines = part.read_text().splitlines(keepends=True)
        part.write_text("".join(lines[:events]))
        expected[name] = live_keys(part)
        with many.open("a") as f, more.open("a") as g:
            f.writelines(lines[:events])
            g.writelines(lines[events:])
    part.unlink()
    generate(one, tables * events, tables * keys, partitions, table="items")
    expected["items"] = live_keys(one)
    return many, more, one, expected


def _settings(root: Path, namespace: str, src: Path, args) -> Settings:
    return load_settings(
        work_dir=args.lake or root / "lake",
        catalog={"namespace": namespace},
        source={"type": "file", "path": str(src), "batch_size": args.ingest_batch},
        spark={"master": "local[2]", "driver_memory": args.driver_memory},
    )


def _timed(fn, *a, **kw) -> float:
    t = time.perf_counter()
    fn(*a, **kw)
    return time.perf_counter() - t


def run(root: Path, args, console) -> dict:
    """One table, then N tables, `args.repeat` times interleaved; the figures of the median run."""
    tables, events, keys = args.tables, args.table_events, args.table_keys
    many_src, more_src, one_src, expected = _streams(root / f"tables{tables}", tables, events, keys, 2)
    one = _settings(root, "bench_one_table", one_src, args)
    many = _settings(root, f"bench_{tables}_tables", many_src, args)
    more = _settings(root, f"bench_{tables}_tables", more_src, args)
    runs: dict[str, list[float]] = {k: [] for k in ("one_ingest", "one_compact", "ingest", "compact", "idle")}
    runs["not_due"], runs["again"] = [], []
    for i in range(args.repeat):
        for s in (one, many):
            systems.drop_namespace(s)
        runs["one_ingest"].append(_timed(run_ingest, one))
        runs["one_compact"].append(_timed(run_compaction, one, force=True))
        runs["ingest"].append(_timed(run_ingest, many))
        runs["compact"].append(_timed(run_compaction, many, force=True))
        runs["idle"].append(_timed(run_compaction, many))  # nothing is due now
        for table, live in expected.items():
            s = one if table == "items" else many
            systems.check_live(s, table, "_key", live, one_src if table == "items" else many_src, table)
        run_ingest(more)
        t = time.perf_counter()
        ran = [r.table for r in run_compaction(more) if r.ran]
        runs["not_due"].append(time.perf_counter() - t)
        if ran:
            console.print(f"[red]{len(ran)} tables ran a round with {MORE:.0%} more events: {ran[:5]}[/red]")
        runs["again"].append(_timed(run_compaction, more, force=True))  # rounds with rows held for their keys
        last = {k: v[-1] for k, v in runs.items()}
        console.print(
            f"run {i + 1} of {args.repeat}: one table {last['one_ingest']:.1f} + {last['one_compact']:.1f} s, "
            f"{tables} tables {last['ingest']:.1f} + {last['compact']:.1f} s, idle pass {last['idle']:.2f} s, "
            f"pass with events not due {last['not_due']:.2f} s, forced {last['again']:.1f} s"
        )
    fig = {"tables": tables, "events_per_table": events, "keys_per_table": keys, "runs_s": runs}
    for k, v in runs.items():
        fig[f"{k}_s"] = sorted(v)[len(v) // 2]
    fig["compact_ratio"] = fig["compact_s"] / fig["one_compact_s"]
    fig["ingest_ratio"] = fig["ingest_s"] / fig["one_ingest_s"]
    if not args.keep_inputs:
        shutil.rmtree(root / f"tables{tables}")
        for s in (one, many):
            systems.drop_namespace(s)
    return fig


def report(fig: dict, console) -> None:
    n, e = fig["tables"], fig["events_per_table"]

    def spread(k: str) -> str:
        v = fig["runs_s"][k]
        return f"{fig[f'{k}_s']:.1f} s" + (f" ({min(v):.1f} - {max(v):.1f})" if len(v) > 1 else "")

    console.print(
        f"one table of {n * e:,} events: ingest {spread('one_ingest')}, compaction {spread('one_compact')}\n"
        f"{n} tables x {e:,} events: ingest {spread('ingest')}, compaction {spread('compact')}\n"
        f"ratio {n} tables / one table: ingest {fig['ingest_ratio']:.2f}, compaction {fig['compact_ratio']:.2f}\n"
        f"a pass over the {n} tables with nothing due: {spread('idle')}\n"
        f"a pass over the {n} tables after {MORE:.0%} more events each (not due): {spread('not_due')}\n"
        f"the same pass forced (a round of {max(1, int(e * MORE))} events a table, into held rows): {spread('again')}"
    )
    checks = [
        (f"compaction within {COMPACTION_RATIO}x of one table's", fig["compact_ratio"] <= COMPACTION_RATIO),
        (f"ingest within {INGEST_RATIO}x of one table's", fig["ingest_ratio"] <= INGEST_RATIO),
    ]
    if n >= IDLE_TABLES:
        checks.append((f"a pass over {n} tables with nothing due < {IDLE_S} s", fig["idle_s"] < IDLE_S))
    for name, ok in checks:
        console.print(f"{n} tables: target {name}: " + ("[green]holds[/green]" if ok else "[red]missed[/red]"))

"""Many tables against one: N tables x E events, and one table of N x E events, through the
same ingest and compaction in one run (`python -m tests.bench --tables N`). Prints both times,
their ratio, a pass over the N tables when nothing is due, and one after 2% more events come
to every table (below the dirty ratio that makes a round due), and that pass forced (small
rounds into the rows held for their keys); checks every table's live keys against the stream's.
With `--cli`, the ingest and the compaction are also run as a user runs them: each command
(`cdclake ingest`, `cdclake compact --force`) a process of its own, its start-up included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


def _command(s: Settings, *args: str) -> None:
    """`cdclake <args>` in a process of its own, on the settings' catalog and source (as
    `CDCLAKE_*` variables); a failure stops the benchmark with the command's last output."""
    env = {
        **os.environ,
        "CDCLAKE_WORK_DIR": str(s.work_dir),
        "CDCLAKE_CATALOG__NAMESPACE": s.catalog.namespace,
        "CDCLAKE_SOURCE__TYPE": "file",
        "CDCLAKE_SOURCE__PATH": str(s.source.path),
        "CDCLAKE_SOURCE__BATCH_SIZE": str(s.source.batch_size),
        "CDCLAKE_SPARK__MASTER": s.spark.master or "local[2]",
        "CDCLAKE_SPARK__DRIVER_MEMORY": s.spark.driver_memory,
    }
    done = subprocess.run([sys.executable, "-m", "connector.cli", *args], env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"cdclake {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")


def _check(one: Settings, many: Settings, expected: dict, sources: tuple[Path, Path], who: str = "") -> None:
    """Every table's live keys against the stream's (the one table is `items`)."""
    for table, live in expected.items():
        s, src = (one, sources[0]) if table == "items" else (many, sources[1])
        systems.check_live(s, table, "_key", live, src, f"{table}{who}")


def _cli_runs(one: Settings, many: Settings, expected: dict, sources: tuple[Path, Path], repeat: int, console) -> dict:
    """One table, then the N tables, each ingested and compacted by the commands in processes
    of their own, `repeat` times interleaved; the live keys checked after each."""
    runs: dict[str, list[float]] = {k: [] for k in ("cli_one_ingest", "cli_one_compact", "cli_ingest", "cli_compact")}
    for i in range(repeat):
        for s, who in ((one, "cli_one_"), (many, "cli_")):
            systems.drop_namespace(s)
            runs[f"{who}ingest"].append(_timed(_command, s, "ingest"))
            runs[f"{who}compact"].append(_timed(_command, s, "compact", "--force"))
        _check(one, many, expected, sources, " (the commands)")
        console.print(
            f"commands, run {i + 1} of {repeat}: one table {runs['cli_one_ingest'][-1]:.1f} + "
            f"{runs['cli_one_compact'][-1]:.1f} s, the tables {runs['cli_ingest'][-1]:.1f} + "
            f"{runs['cli_compact'][-1]:.1f} s"
        )
    return runs


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
        _check(one, many, expected, (one_src, many_src))
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
    if args.cli:
        runs |= _cli_runs(one, many, expected, (one_src, many_src), args.repeat, console)
    fig = {"tables": tables, "events_per_table": events, "keys_per_table": keys, "runs_s": runs}
    for k, v in runs.items():
        fig[f"{k}_s"] = sorted(v)[len(v) // 2]
    for prefix in ("", "cli_") if args.cli else ("",):
        fig[f"{prefix}compact_ratio"] = fig[f"{prefix}compact_s"] / fig[f"{prefix}one_compact_s"]
        fig[f"{prefix}ingest_ratio"] = fig[f"{prefix}ingest_s"] / fig[f"{prefix}one_ingest_s"]
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
    if "cli_ingest" in fig["runs_s"]:
        console.print(
            f"as commands (a process each, start-up included): one table ingest {spread('cli_one_ingest')}, "
            f"compaction {spread('cli_one_compact')}; {n} tables ingest {spread('cli_ingest')}, "
            f"compaction {spread('cli_compact')}\n"
            f"ratio as commands: ingest {fig['cli_ingest_ratio']:.2f}, compaction {fig['cli_compact_ratio']:.2f}"
        )
        checks += [
            (
                f"compaction as a command within {COMPACTION_RATIO}x of one table's",
                fig["cli_compact_ratio"] <= COMPACTION_RATIO,
            ),
            (f"ingest as a command within {INGEST_RATIO}x of one table's", fig["cli_ingest_ratio"] <= INGEST_RATIO),
        ]
    if n >= IDLE_TABLES:
        checks.append((f"a pass over {n} tables with nothing due < {IDLE_S} s", fig["idle_s"] < IDLE_S))
    for name, ok in checks:
        console.print(f"{n} tables: target {name}: " + ("[green]holds[/green]" if ok else "[red]missed[/red]"))

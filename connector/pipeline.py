"""Ingest as a Spark job: source -> stage (decode, write data files) -> admit -> commit to
the log and dead-letter tables.

Each bounded batch a source plans is a Spark DataFrame of raw records. `connector.stage`
decodes it on the executors (`mapInArrow`) and writes each table's fresh rows of each stream
as Parquet data files of that table, where the task runs; one summary per table and stream
comes back to the driver (counts, bytes, first and last position, the files), the quota gate
decides on it, and each table's admitted files are committed with the batch's end positions
in the same snapshot (files of a refused stream are removed). The driver holds one batch's
summaries, never its records; no record crosses back to the JVM. A table met for the first
time gets its files as the table it will be when created at the catalog's default location
with its layout; the driver creates it before committing (and stages the batch again
should another process have made it otherwise).

Exactly-once: each log and dead-letter table records, in the commit that adds its rows,
the next position per stream it has accounted for. A run resumes every stream at the
lowest position any table recorded (0 for a stream a table has not seen), and each table
skips what it already holds (the stage marks those rows not `fresh`), so a crash at any
point and a replay of the same input add nothing twice.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
from pyiceberg.catalog import Catalog

from connector.debezium import Decoder
from connector.sinks import Sinks, at_once
from connector.sources import Source
from iceberg import compat_spark
from iceberg.layouts import DEAD_LETTERS_SUFFIX, LOG_SUFFIX
from iceberg.leases import Lease
from iceberg.log_writer import FileTarget, delete_data_files
from iceberg.summary_keys import APPENDED
from quotas.errors import QuotaExceededError
from quotas.metrics import DEAD_LETTERS, EVENTS, REFUSALS

if TYPE_CHECKING:
    from quotas.admit import Refusal
    from quotas.ledger import QuotaGate

log = logging.getLogger(__name__)


@dataclass
class IngestStats:
    records: int = 0
    batches: int = 0
    duplicates: int = 0
    accepted: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    dead_letters: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    positions: dict[str, int] = field(default_factory=dict)


# How often a table that received nothing records the run's positions (seconds)
POSITIONS_EVERY_S = 60.0


def _caps(gate: QuotaGate | None, sink: str) -> dict[str, int]:
    if gate is None or not sink.endswith(LOG_SUFFIX):
        return {}
    return gate.caps(sink[: -len(LOG_SUFFIX)])


@dataclass
class IngestJob:
    """What an ingest run writes to and how: the namespace's tables (created on first use),
    the decoder, the records per batch, the quota gate and the progress hook (called with
    the stats once a batch is committed)."""

    catalog: Catalog
    namespace: str
    decoder: Decoder
    batch_size: int
    gate: QuotaGate | None = None
    on_batch: Callable[[IngestStats], None] | None = None
    lease: Lease | None = None  # renewed before each commit


@dataclass
class _Run:
    """One run of a job: its Spark session, its open tables and its running figures."""

    spark: Any
    job: IngestJob
    sinks: Sinks
    stats: IngestStats = field(default_factory=IngestStats)


def ingest(
    spark: Any,
    source: Source,
    job: IngestJob,
    max_records: int | None = None,
    make_room: Callable[[list[str]], dict[str, dict[str, int]]] | None = None,
) -> IngestStats:
    """Ingest until the source is caught up (or `max_records` new records were read).

    With a quota gate, a partition that would exceed its table's quota is not committed
    for that table. Policy `fail` raises QuotaExceededError after the batch's other
    partitions are committed; with `make_room` (policy backpressure) the paused tables are
    compacted once the other partitions are caught up, and the run resumes; it raises when
    a paused partition made no progress.
    """
    return _ingest(source, _Run(spark, job, Sinks(job.catalog, job.namespace, job.lease)), max_records, make_room)


def _ingest(
    source: Source,
    run: _Run,
    max_records: int | None,
    make_room: Callable[[list[str]], dict[str, dict[str, int]]] | None,
) -> IngestStats:
    sinks, stats, gate = run.sinks, run.stats, run.job.gate
    stuck: dict[tuple[str, str], int] = {}
    while True:
        # Every table has accounted for everything below the resume positions; a pass
        # only ever records what it read itself on top of them.
        stats.positions = sinks.resume_positions()
        source.seek(stats.positions)
        _one_pass(source, run, max_records, fail_fast=make_room is None)
        # Tables that received nothing lately still record how far the run got, so the next
        # run does not re-read from their older positions: each at most every
        # `POSITIONS_EVERY_S` (a commit per idle table and pass would cost a pass over many
        # tables more than its rows; what a restart re-reads in between is skipped as held).
        records: list[Callable[[], None]] = []
        for name, held in list(sinks.positions.items()):
            wanted = {**stats.positions, **_caps(gate, name)}
            behind = any(held.get(s, 0) < p for s, p in wanted.items())
            if behind and sinks.idle_seconds(name) >= POSITIONS_EVERY_S:
                records.append(functools.partial(sinks.record, name, wanted))
        at_once(records)
        if gate is None or not gate.paused or make_room is None:
            return stats
        now_stuck = {k: r.first_refused for k, r in gate.paused.items()}
        if any(stuck.get(k) == v for k, v in now_stuck.items()):
            raise QuotaExceededError([r for k, r in gate.paused.items() if stuck.get(k) == now_stuck[k]])
        stuck = now_stuck
        tables = sorted({t for t, _ in gate.paused})
        log.warning("backpressure: compacting %s to make room for paused partitions %s", tables, sorted(now_stuck))
        gate.reset(make_room(tables))


def _one_pass(source: Source, run: _Run, max_records: int | None, fail_fast: bool) -> None:
    job, stats = run.job, run.stats
    while max_records is None or (new := stats.records - stats.duplicates) < max_records:
        limit = job.batch_size if max_records is None else min(job.batch_size, max_records - new)
        frame = source.next_frame(run.spark, limit)
        if frame is None:
            return
        try:
            refused, last = _batch(frame, source.expand(), run)
        except Exception as e:  # an executor's SourceError arrives wrapped in Spark's error
            own = _unwrap(e)
            if own is e:
                raise
            raise own from None
        capped = {s for (_, s) in (job.gate.paused if job.gate else {})}
        source.commit({s: v for s, v in last.items() if s not in capped})  # mirrors what the tables hold
        if job.on_batch:
            job.on_batch(stats)
        if refused and fail_fast:
            raise QuotaExceededError(refused)


def _unwrap(e: Exception) -> Exception:
    """The connector's own error raised on an executor (a source that cannot read its range),
    out of the Spark error that carries it; else `e` itself."""
    from connector.core import errors

    raised = compat_spark.raised_in_python_worker(e, errors.__name__)
    cls = getattr(errors, raised[0], None) if raised else None
    if raised and isinstance(cls, type) and issubclass(cls, errors.ConnectorError) and cls is not errors.DecodeError:
        return cls(raised[1])
    return e


def _batch(
    frame: Any, expand: Callable[[Any], Any] | None, run: _Run
) -> tuple[list[Refusal], dict[str, tuple[int, str]]]:
    """One batch through Spark: stage (decode and write data files), admit, commit per table.
    Returns the quota refusals and, per stream, the last record's sequence number and offset."""
    from pyspark.sql import functions as F

    from connector.stage import WRITTEN_SCHEMA, Quotas, StageContext, write_stage

    job, sinks, gate = run.job, run.sinks, run.job.gate
    now = datetime.now(UTC)
    quotas = Quotas(gate.settings if gate is not None else None)
    if expand is None:  # Spark hands text to Python quickly, an array column slowly
        frame = frame.withColumn("headers", F.when(F.size("headers") > 0, F.to_json("headers")))
    started = time.monotonic()
    targets = sinks.targets()
    new_target: Callable[[str], FileTarget] | None = sinks.new_target()
    while True:
        ctx = StageContext(
            copy.deepcopy(job.decoder), copy.deepcopy(sinks.positions), quotas, now, expand, targets, new_target
        )
        stage = functools.partial(write_stage, ctx)
        groups = _merge(frame.mapInArrow(stage, compat_spark.spark_schema(WRITTEN_SCHEMA)).collect())
        # Sinks met for the first time: their tables are created before any of the batch's rows
        # is committed. The files were written for the table as it is created; should it be
        # otherwise (another process made it), the batch is staged again for the table as it is.
        new = sorted({sink for sink, _ in groups} - set(targets))
        at_once([functools.partial(sinks.get, sink) for sink in new])
        if not new or (new_target is not None and all(new_target(sink).fits(sinks.tables[sink]) for sink in new)):
            break
        _discard(sinks, groups.values())
        targets, new_target = sinks.targets(), None
    staged = time.monotonic()
    out = _commit_staged(groups, run, ctx.floors)
    log.info(
        "batch of %s records: read, decoded and written in %.2f s, committed in %.2f s",
        f"{sum(g['n'] for g in groups.values()):,}",
        staged - started,
        time.monotonic() - staged,
    )
    return out


def _merge(rows: list[Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """The tasks' summaries (`WRITTEN_SCHEMA` rows) per sink and stream (a stream that several
    tasks read, a file's, summed up)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["sink"], f"{r['topic']}:{r['partition']}")
        g = out.setdefault(
            key,
            {
                "topic": r["topic"],
                "n": 0,
                "fresh_n": 0,
                "bytes": 0,
                "first": None,
                "enqueued": None,
                "last": (-1, ""),
                "routed": False,
                "files": [],
                "reasons": defaultdict(int),
                "examples": [],
            },
        )
        g["n"] += r["n"]
        g["fresh_n"] += r["fresh_n"]
        g["bytes"] += r["bytes"]
        if r["first"] is not None and (g["first"] is None or r["first"] < g["first"]):
            g["first"] = r["first"]
        if r["enqueued_min"] is not None:
            lo, hi, was = r["enqueued_min"], r["enqueued_max"], g["enqueued"]
            g["enqueued"] = (lo, hi) if was is None else (min(was[0], lo), max(was[1], hi))
        g["last"] = max(g["last"], (r["last"], r["last_offset"]))
        g["routed"] = g["routed"] or bool(r["routed"])
        g["files"] = None if g["files"] is None or r["files"] is None else [*g["files"], r["files"]]
        for reason, n in orjson.loads(r["reasons"] or "{}").items():
            g["reasons"][reason] += n
        g["examples"] += orjson.loads(r["examples"] or "[]")
    return out


def _discard(sinks: Sinks, groups: Iterable[Mapping[str, Any]]) -> None:
    """Remove data files no commit will name."""
    blobs = [b for g in groups for b in g["files"] or []]
    if blobs:
        delete_data_files(next(iter(sinks.tables.values())).io, blobs)


def _commit_staged(
    groups: Mapping[tuple[str, str], Mapping[str, Any]], run: _Run, floors: Mapping[str, Mapping[str, int]]
) -> tuple[list[Refusal], dict[str, tuple[int, str]]]:
    job, sinks, stats, gate = run.job, run.sinks, run.stats, run.job.gate
    last: dict[str, tuple[int, str]] = {}
    per_sink: dict[str, dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for (sink, stream), g in groups.items():
        if stream not in last or g["last"][0] > last[stream][0]:
            last[stream] = g["last"]
        per_sink[sink][stream] = g
        if g["routed"] and sink.endswith(LOG_SUFFIX):
            job.decoder.learn(g["topic"], sink[: -len(LOG_SUFFIX)])
    batch_positions = {**stats.positions}
    for stream, (seq, _) in last.items():
        batch_positions[stream] = max(batch_positions.get(stream, 0), seq + 1)
    _report_dead_letters(per_sink)

    for sink in sorted(per_sink):
        if sinks.positions[sink] != floors.get(sink, {}):  # the stage judged `fresh` by `floors`
            sinks.conflict(sink)
    refusals: list[Refusal] = []
    commits: list[Callable[[], None]] = []
    committed: list[tuple[str, str, dict[str, Mapping[str, Any]], dict[str, Any]]] = []
    for sink, streams in sorted(per_sink.items()):
        table = sink[: -len(LOG_SUFFIX)] if sink.endswith(LOG_SUFFIX) else sink[: -len(DEAD_LETTERS_SUFFIX)]
        stats.duplicates += sum(g["n"] - g["fresh_n"] for g in streams.values())
        incoming = {s: (g["bytes"], g["first"]) for s, g in streams.items() if g["fresh_n"]}
        caps: dict[str, int] = {}
        if gate is not None and sink.endswith(LOG_SUFFIX):
            new = gate.admit(table, incoming)
            for r in new:
                REFUSALS.labels(table, r.stream).inc()
            refusals += new
            caps = _caps(gate, sink)
        kept = {s: g for s, g in streams.items() if g["fresh_n"] and s not in caps}
        _discard(sinks, [g for s, g in streams.items() if s not in kept])
        positions = {**batch_positions, **caps}
        if kept:
            files = [b for g in kept.values() for b in g["files"]]
            record = appended(kept)
            commits.append(functools.partial(sinks.append, sink, files, positions, record))
        committed.append((sink, table, kept, incoming))
    at_once(commits)  # each table's commit is its own
    for sink, table, kept, incoming in committed:
        n = sum(g["fresh_n"] for g in kept.values())
        if sink.endswith(LOG_SUFFIX):
            stats.accepted[table] += n
            EVENTS.labels(table).inc(n)
            if gate is not None:
                for stream in kept:
                    gate.record(table, stream, incoming[stream][0])
        else:
            stats.dead_letters[table] += n
    stats.records += sum(g["n"] for streams in per_sink.values() for g in streams.values())
    stats.batches += 1
    stats.positions = batch_positions
    return refusals, last


def appended(kept: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """A log or dead-letter commit's record of what it appends per stream
    (`summary_keys.APPENDED`): a pass over many tables tells from it whether a table's dirty
    events can make a round due, and whether a row may be past the retention."""
    record = {
        s: [g["first"], g["last"][0] + 1, g["fresh_n"], g["bytes"], *g["enqueued"]]
        for s, g in kept.items()
        if g["enqueued"] is not None
    }
    return APPENDED.entry(record) if len(record) == len(kept) else {}


def _report_dead_letters(per_sink: Mapping[str, Mapping[str, Mapping[str, Any]]], examples: int = 20) -> None:
    """Dead letters: counted by table and reason (metric), the first few logged with where they are."""
    shown = 0
    for sink, streams in sorted(per_sink.items()):
        if not sink.endswith(DEAD_LETTERS_SUFFIX):
            continue
        table = sink[: -len(DEAD_LETTERS_SUFFIX)]
        for stream, g in sorted(streams.items()):
            for reason, n in g["reasons"].items():
                DEAD_LETTERS.labels(table, reason).inc(n)
            for offset, reason, detail in g["examples"][: max(examples - shown, 0)]:
                log.warning("dead letter for table %s at %s offset %s: %s: %s", table, stream, offset, reason, detail)
                shown += 1

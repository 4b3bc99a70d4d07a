"""Ingest as a Spark job: source -> stage (decode) -> admit -> append to the log and
dead-letter tables.

Each bounded batch a source plans is a Spark DataFrame of raw records. `connector.stage`
decodes it on the executors (`mapInArrow`) into rows for their tables, kept for the batch
(`persist`); one aggregate per table and stream comes back to the driver (counts, bytes,
first and last position), the quota gate decides on it, and Spark's Iceberg writer appends
each table's rows with the batch's end positions in the same commit. The driver holds one
batch's aggregates, never its records.

Exactly-once: each log and dead-letter table records, in the commit that adds its rows,
the next position per stream it has accounted for. A run resumes every stream at the
lowest position any table recorded (0 for a stream a table has not seen), and each table
skips what it already holds (the stage marks those rows not `fresh`), so a crash at any
point and a replay of the same input add nothing twice.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.table import Table

from connector.core.errors import ConcurrentWriterError
from connector.core.faults import crash_point
from connector.debezium import Decoder
from connector.sources import Source
from iceberg.layouts import DEAD_LETTER_SCHEMA, DEAD_LETTERS_SUFFIX, LOG_SCHEMA, LOG_SUFFIX
from iceberg.log_writer import (
    POSITIONS_PROPERTY,
    WRITER_PROPERTY,
    append_with_positions,
    committed_positions,
    summary_properties,
    summary_value,
    upgrade,
)
from quotas.errors import QuotaExceededError
from quotas.metrics import DEAD_LETTERS, EVENTS, REFUSALS

if TYPE_CHECKING:
    from quotas.ledger import QuotaGate

log = logging.getLogger(__name__)

COMMIT_ATTEMPTS = 8  # commits that did not move the positions (maintenance) retried over
BRANCH_AGE_MS = 24 * 3600 * 1000  # a run's branch left behind by a crash expires after this


@dataclass
class IngestStats:
    records: int = 0
    batches: int = 0
    duplicates: int = 0
    accepted: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    dead_letters: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    positions: dict[str, int] = field(default_factory=dict)


class Sinks:
    """The log and dead-letter tables of a namespace, created on first use, and the positions
    each has committed.

    One writer per table: each commit is conditional on the table's `main` being where this
    run read its positions. Rows are written by Spark to the run's own branch, and `main` is
    moved to it only if no other commit came in between; a commit that moved the positions
    (another ingest) stops this run with `ConcurrentWriterError`, having added nothing to that
    table, and one that did not (maintenance) is retried on top of it."""

    def __init__(self, catalog: Catalog, namespace: str):
        self.catalog, self.namespace = catalog, namespace
        self.tables: dict[str, Table] = {}
        self.positions: dict[str, dict[str, int]] = {}
        self.writer = f"ingest on {socket.gethostname()} pid {os.getpid()}"
        self.branch = f"cdclake-ingest-{uuid.uuid4().hex[:12]}"
        self.branched: set[str] = set()
        for _, name in catalog.list_tables(namespace):
            if name.endswith((LOG_SUFFIX, DEAD_LETTERS_SUFFIX)):
                self._load(name)

    def _load(self, name: str) -> Table:
        table = upgrade(self.catalog.load_table((self.namespace, name)), _layout(name))
        if table.current_snapshot() is None:  # a first snapshot, so every commit is conditional on one
            try:
                _append(table, self._props(None), "main", crash_tag="ingest.first-snapshot")
            except CommitFailedException:
                pass  # another process gave it one
            table = self.catalog.load_table((self.namespace, name))
        self.tables[name], self.positions[name] = table, committed_positions(table)
        return table

    def get(self, name: str) -> Table:
        if name in self.tables:
            return self.tables[name]
        try:
            return self._load(name)
        except NoSuchTableError:
            crash_point("ingest.create-table")
            try:
                self.catalog.create_table((self.namespace, name), schema=_layout(name))
                log.info("created table %s.%s", self.namespace, name)
            except TableAlreadyExistsError:
                pass  # another process created it first
            return self._load(name)

    def resume_positions(self, streams: Iterable[str] = ()) -> dict[str, int]:
        """Per stream, the lowest next-position of any table (0 if a table lacks it)."""
        known = set(streams).union(*[p.keys() for p in self.positions.values()])
        return {s: min((p.get(s, 0) for p in self.positions.values()), default=0) for s in known}

    def _merged(self, name: str, positions: Mapping[str, int]) -> dict[str, int]:
        held = self.positions[name]
        return {s: max(held.get(s, 0), positions.get(s, 0)) for s in held.keys() | positions.keys()}

    def _props(self, positions: Mapping[str, int] | None) -> dict[str, str]:
        return {**(summary_properties(positions) if positions is not None else {}), WRITER_PROPERTY: self.writer}

    def append(self, name: str, rows: Any, positions: Mapping[str, int]) -> None:
        """Append a Spark DataFrame of staged rows (`connector.stage`) with Spark's Iceberg
        writer, and `positions` (merged with what the table holds) in the same commit."""
        schema = _layout(name)
        columns = ["raw_key AS key" if n == "key" and schema is DEAD_LETTER_SCHEMA else n for n in schema.names]
        columns += [  # a column an older layout had: null in new rows
            f"CAST(NULL AS {f.field_type}) AS `{f.name}`"
            for f in self.tables[name].schema().fields
            if f.name not in schema.names
        ]

        def write(props: Mapping[str, str]) -> None:
            writer = rows.selectExpr(*columns).writeTo(
                f"`{self.catalog.name}`.`{self.namespace}`.`{name}`.`branch_{self.branch}`"
            )
            for k, v in props.items():
                writer = writer.option(f"snapshot-property.{k}", v)
            crash_point("ingest.before-commit")  # nothing written yet for this table
            writer.option("check-nullability", "false").append()  # the stage fills the required columns

        self._commit(name, positions, write)

    def record(self, name: str, positions: Mapping[str, int]) -> None:
        """Commit `positions` (merged with what the table holds) without rows."""

        def write(props: Mapping[str, str]) -> None:
            table = self.catalog.load_table((self.namespace, name))
            _append(table, props, self.branch)

        self._commit(name, positions, write)

    def _commit(self, name: str, positions: Mapping[str, int], write: Callable[[Mapping[str, str]], None]) -> None:
        """`write` a snapshot with `positions` (merged with what the table holds) to the run's
        branch, made at `main`; then move `main` to it, if `main` has not moved meanwhile."""
        for _ in range(COMMIT_ATTEMPTS):
            base = self.tables[name].current_snapshot()
            assert base is not None  # `_load` gives every table a first snapshot
            try:
                self.tables[name].manage_snapshots().create_branch(
                    base.snapshot_id, self.branch, max_ref_age_ms=BRANCH_AGE_MS
                ).commit()
            except CommitFailedException:  # another commit came in between
                self._moved(name)
                continue
            self.branched.add(name)
            try:
                write(self._props(self._merged(name, positions)))
            except CommitFailedException:  # another commit came in between
                self._moved(name)
                continue
            crash_point("ingest.before-publish")  # the snapshot is on the run's branch, not in the table
            if self._publish(name, base.snapshot_id):
                crash_point("ingest.after-commit")
                self._load(name)
                return
        raise ConcurrentWriterError(
            f"table {self.namespace}.{name}: other commits came in between each of {COMMIT_ATTEMPTS} attempts "
            "to commit a batch; nothing of it was committed. Rerun: it resumes where the tables are"
        )

    def _publish(self, name: str, base: int) -> bool:
        """Move `main` to the run's branch if `main` is still at `base`; False (and the table
        reloaded) if a commit that did not move the positions came in between."""
        table = self.catalog.load_table((self.namespace, name))
        head = table.refs()[self.branch].snapshot_id
        main, snapshot = table.current_snapshot(), table.snapshot_by_id(head)
        if main and main.snapshot_id == base and snapshot and snapshot.parent_snapshot_id == base:
            try:  # a ref update: pyiceberg does not retry it, and it asserts `main` is `base`
                table.manage_snapshots().set_current_snapshot(snapshot_id=head).commit()
                return True
            except CommitFailedException:
                pass
        self._moved(name)
        return False

    def _moved(self, name: str) -> None:
        """After a conflicting commit: reload the table; stop if its positions moved."""
        held = self.positions[name]
        self._load(name)
        if self.positions[name] != held:
            self.conflict(name)

    def conflict(self, name: str) -> None:
        """Stop: another writer moved the table's positions past what this run read."""
        other = summary_value(self.tables[name], WRITER_PROPERTY, with_key=POSITIONS_PROPERTY) or "another writer"
        raise ConcurrentWriterError(
            f"table {self.namespace}.{name}: {other} committed positions while this ingest was writing; "
            "nothing of this batch was committed to it and this run stops. Run one ingest per table at a "
            "time; a rerun resumes where the tables are"
        )

    def close(self) -> None:
        """Remove the run's branch (best effort: a branch left behind expires with
        `BRANCH_AGE_MS` at the next snapshot expiry)."""
        for name in sorted(self.branched):
            try:
                table = self.catalog.load_table((self.namespace, name))
                if self.branch in table.refs():
                    table.manage_snapshots().remove_branch(self.branch).commit()
            except Exception as e:  # noqa: BLE001 - cleanup only
                log.debug("could not remove branch %s of %s: %s", self.branch, name, e)
        self.branched.clear()


def _append(table: Table, props: Mapping[str, str], branch: str, **kw: Any) -> None:
    """A commit without rows (by pyiceberg), a conflict always as `CommitFailedException`."""
    try:
        append_with_positions(table, table.schema().as_arrow().empty_table(), None, props, branch=branch, **kw)
    except ValueError as e:  # pyiceberg's word for a snapshot built on stale metadata (sequence numbers)
        if "sequence number" not in str(e):
            raise
        raise CommitFailedException(str(e)) from e


def _layout(name: str) -> pa.Schema:
    return LOG_SCHEMA if name.endswith(LOG_SUFFIX) else DEAD_LETTER_SCHEMA


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
    """Ingest until the source is caught up (or `max_records` were read).

    With a quota gate, a partition that would exceed its table's quota is not committed
    for that table. Policy `fail` raises QuotaExceededError after the batch's other
    partitions are committed; with `make_room` (policy backpressure) the paused tables are
    compacted once the other partitions are caught up, and the run resumes; it raises when
    a paused partition made no progress.
    """
    run = _Run(spark, job, Sinks(job.catalog, job.namespace))
    try:
        return _ingest(source, run, max_records, make_room)
    finally:
        run.sinks.close()


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
        # run does not re-read from their older positions.
        for name, held in list(sinks.positions.items()):
            wanted = {**stats.positions, **_caps(gate, name)}
            if any(held.get(s, 0) < p for s, p in wanted.items()):
                sinks.record(name, wanted)
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
    while max_records is None or stats.records < max_records:
        limit = job.batch_size if max_records is None else min(job.batch_size, max_records - stats.records)
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

    m = re.search(r"connector\.core\.errors\.(\w+): ([^\n]*)", str(e))
    cls = getattr(errors, m.group(1), None) if m else None
    if m and isinstance(cls, type) and issubclass(cls, errors.ConnectorError) and cls is not errors.DecodeError:
        return cls(m.group(2))
    return e


def _batch(frame: Any, expand: Callable | None, run: _Run) -> tuple[list, dict[str, tuple[int, str]]]:
    """One batch through Spark: stage (decode), aggregate, admit, append per table. Returns
    the quota refusals and, per stream, the last record's sequence number and offset."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from connector.stage import STAGED_SCHEMA, Quotas, StageContext, decode_stage

    job, sinks, gate = run.job, run.sinks, run.job.gate
    now = datetime.now(UTC)
    quotas = Quotas(gate.settings if gate is not None else None)
    ctx = StageContext(copy.deepcopy(job.decoder), copy.deepcopy(sinks.positions), quotas, now, expand)
    if expand is None:  # Spark hands text to Python quickly, an array column slowly
        frame = frame.withColumn("headers", F.when(F.size("headers") > 0, F.to_json("headers")))
    started = time.monotonic()
    staged = frame.mapInArrow(lambda batches: decode_stage(ctx, batches), from_arrow_schema(STAGED_SCHEMA))
    # Decoded once and held on the executors for the batch's jobs: a local checkpoint keeps
    # the rows as they are (measured 0.75 s per 180k events against 1.25 s for `persist`,
    # which builds a columnar cache), and is released explicitly when the batch is done.
    staged = staged.localCheckpoint(eager=True)
    try:
        fresh = F.col("fresh")
        groups = (
            staged.groupBy("sink", "topic", "partition")
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.count_if(fresh).alias("fresh_n"),
                F.sum(F.when(fresh, F.col("payload_bytes"))).alias("bytes"),
                F.min(F.when(fresh, F.col("sequence_number"))).alias("first"),
                F.max_by(F.struct("sequence_number", "offset"), "sequence_number").alias("last"),
                F.bool_or(F.col("op").isNotNull() & ~F.col("tombstone")).alias("routed"),
            )
            .collect()
        )
        decoded = time.monotonic()
        out = _commit_staged(staged, groups, run, ctx.floors)
        log.info(
            "batch of %s records: read and decoded in %.2f s, committed in %.2f s",
            f"{sum(g['n'] for g in groups):,}",
            decoded - started,
            time.monotonic() - decoded,
        )
        return out
    finally:
        staged._jdf.queryExecution().analyzed().rdd().unpersist(False)  # the checkpoint's blocks


def _commit_staged(staged: Any, groups: list, run: _Run, floors: Mapping[str, Mapping[str, int]]) -> tuple[list, dict]:
    from pyspark.sql import functions as F

    job, sinks, stats, gate = run.job, run.sinks, run.stats, run.job.gate
    last: dict[str, tuple[int, str]] = {}
    per_sink: dict[str, dict[str, Any]] = defaultdict(dict)
    for g in groups:
        stream = f"{g['topic']}:{g['partition']}"
        if stream not in last or g["last"]["sequence_number"] > last[stream][0]:
            last[stream] = (g["last"]["sequence_number"], g["last"]["offset"])
        per_sink[g["sink"]][stream] = g
        if g["routed"] and g["sink"].endswith(LOG_SUFFIX):
            job.decoder.learn(g["topic"], g["sink"][: -len(LOG_SUFFIX)])
    batch_positions = {**stats.positions}
    for stream, (seq, _) in last.items():
        batch_positions[stream] = max(batch_positions.get(stream, 0), seq + 1)
    _report_dead_letters(staged, per_sink)

    # Every table of the batch exists before any of its rows is committed: a table that cannot
    # be created fails the batch whole, and its records stay ahead of every resume position.
    for sink in sorted(per_sink):
        sinks.get(sink)
        if sinks.positions[sink] != floors.get(sink, {}):  # the stage judged `fresh` by `floors`
            sinks.conflict(sink)
    refusals: list = []
    for sink, streams in sorted(per_sink.items()):
        table = sink[: -len(LOG_SUFFIX)] if sink.endswith(LOG_SUFFIX) else sink[: -len(DEAD_LETTERS_SUFFIX)]
        stats.duplicates += sum(g["n"] - g["fresh_n"] for g in streams.values())
        incoming = {s: (g["bytes"] or 0, g["first"]) for s, g in streams.items() if g["fresh_n"]}
        caps: dict[str, int] = {}
        if gate is not None and sink.endswith(LOG_SUFFIX):
            new = gate.admit(table, incoming)
            for r in new:
                REFUSALS.labels(table, r.stream).inc()
            refusals += new
            caps = _caps(gate, sink)
        kept = {s: g for s, g in streams.items() if g["fresh_n"] and s not in caps}
        positions = {**batch_positions, **caps}
        if kept:
            rows = staged.where(
                (F.col("sink") == sink)
                & F.col("fresh")
                & F.concat_ws(":", "topic", F.col("partition").cast("string")).isin(sorted(kept))
            )
            sinks.append(sink, rows, positions)
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


def _report_dead_letters(staged: Any, per_sink: Mapping[str, Mapping[str, Any]], examples: int = 20) -> None:
    """Dead letters: counted by table and reason (metric), the first few logged with where they are."""
    from pyspark.sql import functions as F

    if not any(s.endswith(DEAD_LETTERS_SUFFIX) and any(g["fresh_n"] for g in v.values()) for s, v in per_sink.items()):
        return
    letters = staged.where(F.col("reason").isNotNull() & F.col("fresh"))
    for r in letters.groupBy("sink", "reason").count().collect():
        DEAD_LETTERS.labels(r["sink"][: -len(DEAD_LETTERS_SUFFIX)], r["reason"]).inc(r["count"])
    for r in letters.select("sink", "topic", "partition", "offset", "reason", "detail").limit(examples).collect():
        log.warning(
            "dead letter for table %s at %s:%s offset %s: %s: %s",
            r["sink"][: -len(DEAD_LETTERS_SUFFIX)],
            r["topic"],
            r["partition"],
            r["offset"],
            r["reason"],
            r["detail"],
        )

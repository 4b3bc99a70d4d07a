"""Ingest: source -> decode -> route -> append to the log / dead-letter tables.

Exactly-once: each log and dead-letter table records, in the commit that adds its rows,
the next position per stream it has accounted for. A run resumes every stream at the
lowest position any table recorded (0 for a stream a table has not seen), and each table
skips what it already holds, so a crash at any point and a replay of the same input add
nothing twice.
"""

from __future__ import annotations

import copy
import gc
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from connector.batch import RecordBatch, Rows, at_or_after, dead_letter_rows, decode_batch, streams_of
from connector.core.faults import crash_point
from connector.core.records import DeadLetter, SourceRecord
from connector.debezium import Decoder
from connector.sources import Source
from iceberg.layouts import DEAD_LETTER_SCHEMA, DEAD_LETTERS_SUFFIX, LOG_SCHEMA, LOG_SUFFIX
from iceberg.log_writer import append_with_positions, committed_positions
from quotas.errors import QuotaExceededError
from quotas.metrics import DEAD_LETTERS, EVENTS, REFUSALS

if TYPE_CHECKING:
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


class Sinks:
    """The log and dead-letter tables of a namespace, created on first use.

    Appends run on one writer thread in the order given, so the next batch is read and
    decoded while this one's Parquet files are written (Arrow writes them without the GIL).
    `positions` are what the queued appends record; `settle` waits until they are
    committed and raises the first that failed; after a failure nothing more is appended.
    """

    def __init__(self, catalog: Catalog, namespace: str):
        self.catalog, self.namespace = catalog, namespace
        self.tables: dict[str, Table] = {}
        self.positions: dict[str, dict[str, int]] = {}
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="log-writer")
        self._queued: list[Future] = []
        self._failed: BaseException | None = None
        for _, name in catalog.list_tables(namespace):
            if name.endswith((LOG_SUFFIX, DEAD_LETTERS_SUFFIX)):
                self._load(name)

    def _load(self, name: str) -> Table:
        table = self.catalog.load_table((self.namespace, name))
        self.tables[name], self.positions[name] = table, committed_positions(table)
        return table

    def get(self, name: str, schema: pa.Schema) -> Table:
        if name in self.tables:
            return self.tables[name]
        self.settle()  # the catalog changes only from one thread at a time
        try:
            return self._load(name)
        except NoSuchTableError:
            crash_point("ingest.create-table")
            table = self.catalog.create_table((self.namespace, name), schema=schema)
            self.tables[name], self.positions[name] = table, {}
            log.info("created table %s.%s", self.namespace, name)
            return table

    def resume_positions(self, streams: Iterable[str] = ()) -> dict[str, int]:
        """Per stream, the lowest next-position of any table (0 if a table lacks it)."""
        known = set(streams).union(*[p.keys() for p in self.positions.values()])
        return {s: min((p.get(s, 0) for p in self.positions.values()), default=0) for s in known}

    def commit(self, name: str, rows: pa.Table, positions: Mapping[str, int]) -> None:
        held = self.positions[name]
        merged = {s: max(held.get(s, 0), positions.get(s, 0)) for s in held.keys() | positions.keys()}
        self._queued.append(self._writer.submit(self._append, self.tables[name], rows, merged))
        self.positions[name] = merged

    def _append(self, table: Table, rows: pa.Table, positions: dict[str, int]) -> None:
        if self._failed is None:  # an append after a failed one would record positions past a gap
            try:
                append_with_positions(table, rows, positions)  # the commit updates the table object
            except BaseException as e:
                self._failed = e
                raise

    def settle(self) -> None:
        """Wait for the queued appends; raise the first failure."""
        queued, self._queued = self._queued, []
        for f in queued:
            f.exception()
        if self._failed is not None:
            raise self._failed

    def close(self) -> None:
        """Let the queued appends finish (what was accepted is committed), then stop the writer."""
        self._writer.shutdown(wait=True)


@contextmanager
def batch_gc(young: int = 100_000) -> Iterator[None]:
    """Fewer cycle collections while batches are in flight.

    A batch holds a few objects per record alive until its commit; with Python's default
    thresholds (700 allocations) the collector re-walks that whole batch over and over:
    measured 25 -> 16 us per record on the 200k-record benchmark batch. Records form no
    cycles, so collecting every `young` allocations loses nothing; the thresholds are
    restored afterwards.
    """
    saved = gc.get_threshold()
    gc.set_threshold(young, 50, 1000)
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def _caps(gate: QuotaGate | None, sink: str) -> dict[str, int]:
    if gate is None or not sink.endswith(LOG_SUFFIX):
        return {}
    return gate.caps(sink[: -len(LOG_SUFFIX)])


@dataclass
class IngestJob:
    """What an ingest run writes to and how: the namespace's tables (created on first use),
    the decoder, the records per commit, the quota gate and the progress hook (called with
    the stats once a batch is committed)."""

    catalog: Catalog
    namespace: str
    decoder: Decoder
    batch_size: int
    gate: QuotaGate | None = None
    on_batch: Callable[[IngestStats], None] | None = None


@dataclass
class _Run:
    """One run of a job: its open tables and its running figures."""

    job: IngestJob
    sinks: Sinks
    stats: IngestStats = field(default_factory=IngestStats)


def ingest(
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
    run = _Run(job, Sinks(job.catalog, job.namespace))
    try:
        with batch_gc():
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
                sinks.commit(name, sinks.tables[name].schema().as_arrow().empty_table(), wanted)
        sinks.settle()
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
    stats, batch_size, on_batch = run.stats, run.job.batch_size, run.job.on_batch
    queued: IngestStats | None = None  # the stats as of the batch whose appends are queued

    def settled() -> None:  # that batch is committed: its positions go to the source, its stats to the hook
        nonlocal queued
        if queued is not None:
            source.commit(queued.positions)  # the source's own offsets follow the Iceberg commits
            if on_batch:
                on_batch(queued)
            queued = None

    refused: list = []
    while max_records is None or stats.records < max_records:
        limit = batch_size if max_records is None else min(batch_size, max_records - stats.records)
        batch = source.poll_batch(limit)
        if not len(batch):
            break
        refused = _ingest_batch(batch, run, settled)
        queued = copy.deepcopy(stats)
        if refused and fail_fast:
            break
    run.sinks.settle()
    settled()
    if refused and fail_fast:
        raise QuotaExceededError(refused)


def _per_stream(rows: pa.Table, **aggregates: tuple[str, str]) -> dict[str, dict[str, int]]:
    """{stream: {name: aggregate}} over log rows, e.g. bytes=("payload_bytes", "sum")."""
    if not rows.num_rows:
        return {}
    grouped = rows.append_column("_stream", streams_of(rows)).group_by("_stream").aggregate(list(aggregates.values()))
    cols = {name: grouped[f"{c}_{fn}"].to_pylist() for name, (c, fn) in aggregates.items()}
    return {s: {name: cols[name][i] for name in aggregates} for i, s in enumerate(grouped["_stream"].to_pylist())}


def _ingest_batch(batch: RecordBatch, run: _Run, settled: Callable[[], None] = lambda: None) -> list:
    """Decodes one batch while the previous one's appends run; once they are committed, calls
    `settled` and queues this batch's appends to every table it touches. Returns the quota
    refusals."""
    sinks, stats, gate = run.sinks, run.stats, run.job.gate
    now = datetime.now(UTC)
    decoded = decode_batch(run.job.decoder, batch, now)
    sinks.settle()
    settled()
    events = {table: Rows.concat(parts) for table, parts in decoded.events.items()}
    if gate is not None:
        for table, rows in events.items():
            over = pc.greater(rows.table["payload_bytes"], gate.quota(table).max_event_bytes)
            if pc.any(over).as_py():
                for record in batch.records(rows.idx.filter(over).to_pylist()):
                    decoded.letters[table].append(
                        DeadLetter(record, table, "size", gate.oversize(table, record.nbytes) or "over the size limit")
                    )
                events[table] = rows.keep(pc.invert(over))
    for table, letters in decoded.letters.items():
        for d in letters:
            log.warning("dead letter for table %s at %s: %s: %s", table, d.record.where(), d.reason, d.detail)
            DEAD_LETTERS.labels(table, d.reason).inc()
    batch_positions = {**stats.positions}
    for stream, p in batch.positions().items():
        batch_positions[stream] = max(batch_positions.get(stream, 0), p)

    refusals: list = []
    # Every table of the batch exists before any of its rows is committed: a table that cannot
    # be created fails the batch whole, and its records stay ahead of every resume position.
    for table in decoded.letters:
        sinks.get(table + DEAD_LETTERS_SUFFIX, DEAD_LETTER_SCHEMA)
    for table in events:
        sinks.get(table + LOG_SUFFIX, LOG_SCHEMA)
    for table, letters in decoded.letters.items():
        name = table + DEAD_LETTERS_SUFFIX
        held = sinks.positions[name]
        fresh = [d for d in letters if d.record.sequence_number >= held.get(d.record.stream, 0)]
        stats.duplicates += len(letters) - len(fresh)
        sinks.commit(name, dead_letter_rows(fresh, now), batch_positions)
        stats.dead_letters[table] += len(fresh)
    for table, rows in events.items():
        name = table + LOG_SUFFIX
        fresh = rows.table.filter(at_or_after(rows.table, sinks.positions[name]))
        stats.duplicates += rows.table.num_rows - fresh.num_rows
        caps: dict[str, int] = {}
        if gate is not None:
            incoming = _per_stream(fresh, bytes=("payload_bytes", "sum"), first=("sequence_number", "min"))
            new = gate.admit(table, {s: (v["bytes"], v["first"]) for s, v in incoming.items()})
            for r in new:
                REFUSALS.labels(table, r.stream).inc()
            refusals += new
            caps = _caps(gate, name)
            if caps:
                fresh = fresh.filter(pc.invert(pc.is_in(streams_of(fresh), pa.array(sorted(caps), pa.string()))))
        sinks.commit(name, fresh, {**batch_positions, **caps})
        stats.accepted[table] += fresh.num_rows
        EVENTS.labels(table).inc(fresh.num_rows)
        if gate is not None:  # what was committed: the intake of the streams not capped
            for stream, v in incoming.items():
                if stream not in caps:
                    gate.record(table, stream, v["bytes"])
    stats.records += len(batch)
    stats.batches += 1
    stats.positions = batch_positions
    return refusals


def ingest_spark_stream(
    spark: Any, source: type, options: Mapping[str, str], job: IngestJob, mirror: Any = None
) -> IngestStats:
    """A PySpark streaming data source (`source`, run with availableNow): every micro-batch goes
    through the same decode -> admit -> log append as `ingest`, from the tables' positions.
    After each Iceberg commit, `mirror.update({stream: (sequence_number, offset)})` copies
    the committed positions into the source's tooling."""
    from connector.sources.spark_stream import run_available_now

    sinks = Sinks(job.catalog, job.namespace)
    run = _Run(job, sinks, IngestStats(positions=sinks.resume_positions()))
    stats, gate, on_batch = run.stats, job.gate, job.on_batch
    failure: list[BaseException] = []

    def on_records(records: list[SourceRecord]) -> None:
        try:
            for i in range(0, len(records), job.batch_size):
                chunk = records[i : i + job.batch_size]
                refused = _ingest_batch(RecordBatch.of(chunk), run)
                sinks.settle()
                if mirror is not None:
                    capped = {s for (_, s) in (gate.paused if gate else {})}
                    mirror.update({r.stream: (r.sequence_number, r.offset) for r in chunk if r.stream not in capped})
                if on_batch:
                    on_batch(stats)
                if refused:
                    raise QuotaExceededError(refused)
        except BaseException as e:  # re-raised below with its type; Spark would wrap it
            failure.append(e)
            raise

    try:
        with batch_gc():
            run_available_now(spark, source, {**options, "positions": json.dumps(stats.positions)}, on_records)
    except Exception:
        if failure:
            raise failure[0] from None
        raise
    finally:
        sinks.close()
    return stats

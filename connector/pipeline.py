"""Ingest: source -> decode -> route -> append to the log / dead-letter tables.

Exactly-once: each log and dead-letter table records, in the commit that adds its rows,
the next position per stream it has accounted for. A run resumes every stream at the
lowest position any table recorded (0 for a stream a table has not seen), and each table
skips what it already holds, so a crash at any point and a replay of the same input add
nothing twice.
"""

from __future__ import annotations

import gc
import json
import logging
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

import orjson
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from connector.debezium import Decoder
from connector.records import ChangeEvent, DeadLetter, SourceRecord
from connector.sources import Source
from iceberg.layouts import DEAD_LETTER_SCHEMA, DEAD_LETTERS_SUFFIX, LOG_SCHEMA, LOG_SUFFIX, UTC_TS
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


def _headers(r: SourceRecord) -> str | None:
    if not r.headers:
        return None
    return orjson.dumps({k: (v.decode("utf-8", "replace") if v is not None else None) for k, v in r.headers}).decode()


def _types_json(types: dict[str, str], memo: dict[int, tuple[dict, str]]) -> str:
    """Serialised once per types object (the decoder shares one per schema signature)."""
    hit = memo.get(id(types))
    if hit is None or hit[0] is not types:
        hit = memo[id(types)] = (types, orjson.dumps(types, option=orjson.OPT_SORT_KEYS).decode())
    return hit[1]


def log_rows(events: list[ChangeEvent], now: datetime) -> pa.Table:
    recs = [e.record for e in events]
    memo: dict[int, tuple[dict, str]] = {}
    return pa.Table.from_pydict({
        "topic": [r.topic for r in recs],
        "partition": [r.partition for r in recs],
        "offset": [r.offset for r in recs],
        "sequence_number": [r.sequence_number for r in recs],
        "enqueued_time": [r.enqueued_time for r in recs],
        "key": [e.key for e in events],
        "op": [e.op for e in events],
        "snapshot": [e.snapshot for e in events],
        "tombstone": [e.tombstone for e in events],
        "source_position": [list(e.position) if e.position is not None else None for e in events],
        "source_ts_ms": [e.source_ts_ms for e in events],
        "after": [orjson.dumps(e.after).decode() if e.after is not None else None for e in events],
        "after_types": [_types_json(e.after_types, memo) if e.after_types else None for e in events],
        "value": [r.value for r in recs],
        "payload_bytes": [r.nbytes for r in recs],
        "headers": [_headers(r) for r in recs],
        "ingested_at": pa.repeat(pa.scalar(now, UTC_TS), len(recs)),
    }, schema=LOG_SCHEMA)


def dead_letter_rows(letters: list[DeadLetter], now: datetime) -> pa.Table:
    recs = [d.record for d in letters]
    return pa.Table.from_pydict({
        "topic": [r.topic for r in recs],
        "partition": [r.partition for r in recs],
        "offset": [r.offset for r in recs],
        "sequence_number": [r.sequence_number for r in recs],
        "enqueued_time": [r.enqueued_time for r in recs],
        "key": [r.key for r in recs],
        "value": [r.value for r in recs],
        "reason": [d.reason for d in letters],
        "detail": [d.detail for d in letters],
        "ingested_at": [now] * len(recs),
    }, schema=DEAD_LETTER_SCHEMA)


class Sinks:
    """The log and dead-letter tables of a namespace, created on first use."""

    def __init__(self, catalog: Catalog, namespace: str):
        self.catalog, self.namespace = catalog, namespace
        self.tables: dict[str, Table] = {}
        self.positions: dict[str, dict[str, int]] = {}
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
        try:
            return self._load(name)
        except NoSuchTableError:
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
        append_with_positions(self.tables[name], rows, merged)  # the commit updates the table object
        self.positions[name] = merged


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


def _caps(gate: "QuotaGate | None", sink: str) -> dict[str, int]:
    if gate is None or not sink.endswith(LOG_SUFFIX):
        return {}
    return gate.caps(sink[: -len(LOG_SUFFIX)])


def ingest(
    source: Source,
    catalog: Catalog,
    namespace: str,
    decoder: Decoder,
    batch_size: int,
    on_batch: Callable[[IngestStats], None] | None = None,
    max_records: int | None = None,
    gate: "QuotaGate | None" = None,
    make_room: Callable[[list[str]], dict[str, dict[str, int]]] | None = None,
) -> IngestStats:
    """Ingest until the source is caught up (or `max_records` were read).

    With a quota gate, a partition that would exceed its table's quota is not committed
    for that table. Policy `fail` raises QuotaExceededError after the batch's other
    partitions are committed; with `make_room` (policy backpressure) the paused tables are
    compacted once the other partitions are caught up, and the run resumes; it raises when
    a paused partition made no progress.
    """
    with batch_gc():
        return _ingest(source, catalog, namespace, decoder, batch_size, on_batch, max_records, gate, make_room)


def _ingest(source: Source, catalog: Catalog, namespace: str, decoder: Decoder, batch_size: int,
            on_batch: Callable[[IngestStats], None] | None, max_records: int | None, gate: "QuotaGate | None",
            make_room: Callable[[list[str]], dict[str, dict[str, int]]] | None) -> IngestStats:
    sinks = Sinks(catalog, namespace)
    stats = IngestStats()
    stuck: dict[tuple[str, str], int] = {}
    while True:
        # Every table has accounted for everything below the resume positions; a pass
        # only ever records what it read itself on top of them.
        stats.positions = sinks.resume_positions()
        source.seek(stats.positions)
        _one_pass(source, sinks, decoder, batch_size, stats, on_batch, max_records, gate, make_room is None)
        # Tables that received nothing lately still record how far the run got, so the next
        # run does not re-read from their older positions.
        for name, held in list(sinks.positions.items()):
            wanted = {**stats.positions, **_caps(gate, name)}
            if any(held.get(s, 0) < p for s, p in wanted.items()):
                sinks.commit(name, sinks.tables[name].schema().as_arrow().empty_table(), wanted)
        if gate is None or not gate.paused or make_room is None:
            return stats
        now_stuck = {k: r.first_refused for k, r in gate.paused.items()}
        if any(stuck.get(k) == v for k, v in now_stuck.items()):
            raise QuotaExceededError([r for k, r in gate.paused.items() if stuck.get(k) == now_stuck[k]])
        stuck = now_stuck
        tables = sorted({t for t, _ in gate.paused})
        log.warning("backpressure: compacting %s to make room for paused partitions %s", tables, sorted(now_stuck))
        gate.reset(make_room(tables))


def _one_pass(source: Source, sinks: "Sinks", decoder: Decoder, batch_size: int, stats: IngestStats,
              on_batch: Callable[[IngestStats], None] | None, max_records: int | None,
              gate: "QuotaGate | None", fail_fast: bool) -> None:
    while max_records is None or stats.records < max_records:
        limit = batch_size if max_records is None else min(batch_size, max_records - stats.records)
        batch = source.poll(limit)
        if not batch:
            return
        refused = _ingest_batch(batch, sinks, decoder, stats, gate)
        source.commit(stats.positions)
        if on_batch:
            on_batch(stats)
        if refused and fail_fast:
            raise QuotaExceededError(refused)


def _ingest_batch(batch: list[SourceRecord], sinks: Sinks, decoder: Decoder, stats: IngestStats,
                  gate: "QuotaGate | None" = None) -> list:
    """Commits one batch to every table it touches; returns the quota refusals."""
    now = datetime.now(timezone.utc)
    events: dict[str, list[ChangeEvent]] = defaultdict(list)
    letters: dict[str, list[DeadLetter]] = defaultdict(list)
    for record in batch:
        out = decoder.decode(record)
        if gate is not None and isinstance(out, ChangeEvent):
            too_large = gate.oversize(out.table, record.nbytes)
            if too_large:
                out = DeadLetter(record, out.table, "size", too_large)
        if isinstance(out, DeadLetter):
            log.warning("dead letter for table %s at %s: %s: %s", out.table, record.where(), out.reason, out.detail)
            DEAD_LETTERS.labels(out.table, out.reason).inc()
            letters[out.table + DEAD_LETTERS_SUFFIX].append(out)
        else:
            events[out.table + LOG_SUFFIX].append(out)
    batch_positions = dict(stats.positions)
    for r in batch:
        batch_positions[r.stream] = max(batch_positions.get(r.stream, 0), r.sequence_number + 1)

    refusals: list = []
    for groups, schema, to_rows, counter in (
        (events, LOG_SCHEMA, log_rows, stats.accepted),
        (letters, DEAD_LETTER_SCHEMA, dead_letter_rows, stats.dead_letters),
    ):
        for name, items in groups.items():
            table = name.rsplit("__", 1)[0]
            sinks.get(name, schema)
            held = sinks.positions[name]
            fresh = [i for i in items if i.record.sequence_number >= held.get(i.record.stream, 0)]
            stats.duplicates += len(items) - len(fresh)
            if gate is not None and groups is events:
                incoming: dict[str, tuple[int, int]] = {}
                for e in fresh:
                    n, first = incoming.get(e.record.stream, (0, e.record.sequence_number))
                    incoming[e.record.stream] = (n + e.record.nbytes, min(first, e.record.sequence_number))
                new = gate.admit(table, incoming)
                for r in new:
                    REFUSALS.labels(table, r.stream).inc()
                refusals += new
                caps = _caps(gate, name)
                fresh = [e for e in fresh if e.record.stream not in caps]
            sinks.commit(name, to_rows(fresh, now), {**batch_positions, **_caps(gate, name)})
            counter[table] += len(fresh)
            if groups is events:
                EVENTS.labels(table).inc(len(fresh))
                committed: dict[str, int] = defaultdict(int)
                for e in fresh:
                    committed[e.record.stream] += e.record.nbytes
                for stream, nbytes in committed.items():
                    if gate is not None:
                        gate.record(table, stream, nbytes)
    stats.records += len(batch)
    stats.batches += 1
    stats.positions = batch_positions
    return refusals


def ingest_spark_stream(
    spark: Any, source: type, options: Mapping[str, str], catalog: Catalog, namespace: str, decoder: Decoder,
    batch_size: int, gate: "QuotaGate | None" = None, on_batch: Callable[[IngestStats], None] | None = None,
    mirror: Any = None,
) -> IngestStats:
    """A PySpark streaming data source (`source`, run with availableNow): every micro-batch goes
    through the same decode -> admit -> log append as `ingest`, from the tables' positions.
    After each Iceberg commit, `mirror.update({stream: (sequence_number, offset)})` copies
    the committed positions into the source's tooling."""
    from connector.sources.spark_stream import run_available_now

    sinks = Sinks(catalog, namespace)
    stats = IngestStats(positions=sinks.resume_positions())
    failure: list[BaseException] = []

    def on_records(records: list[SourceRecord]) -> None:
        try:
            for i in range(0, len(records), batch_size):
                chunk = records[i: i + batch_size]
                refused = _ingest_batch(chunk, sinks, decoder, stats, gate)
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
    return stats

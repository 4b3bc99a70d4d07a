"""Ingest: source -> decode -> route -> append to the log / dead-letter tables.

Exactly-once: each log and dead-letter table records, in the commit that adds its rows,
the next position per stream it has accounted for. A run resumes every stream at the
lowest position any table recorded (0 for a stream a table has not seen), and each table
skips what it already holds, so a crash at any point and a replay of the same input add
nothing twice.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Iterable, Mapping

import orjson
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from connector.debezium import Decoder
from connector.records import ChangeEvent, DeadLetter, SourceRecord
from connector.sources import Source
from iceberg.layouts import DEAD_LETTER_SCHEMA, DEAD_LETTERS_SUFFIX, LOG_SCHEMA, LOG_SUFFIX
from iceberg.log_writer import append_with_positions, committed_positions

log = logging.getLogger(__name__)


@dataclass
class IngestStats:
    records: int = 0
    batches: int = 0
    duplicates: int = 0
    accepted: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    dead_letters: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    positions: dict[str, int] = field(default_factory=dict)


def _payload_bytes(r: SourceRecord) -> int:
    return len(r.key or b"") + len(r.value or b"")


def _headers(r: SourceRecord) -> str | None:
    if not r.headers:
        return None
    return orjson.dumps({k: (v.decode("utf-8", "replace") if v is not None else None) for k, v in r.headers}).decode()


def log_rows(events: list[ChangeEvent], now: datetime) -> pa.Table:
    recs = [e.record for e in events]
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
        "after_types": [orjson.dumps(e.after_types, option=orjson.OPT_SORT_KEYS).decode() if e.after_types else None
                        for e in events],
        "value": [r.value for r in recs],
        "payload_bytes": [_payload_bytes(r) for r in recs],
        "headers": [_headers(r) for r in recs],
        "ingested_at": [now] * len(recs),
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
        append_with_positions(self.tables[name], rows, merged)
        self.tables[name] = self.tables[name].refresh()
        self.positions[name] = merged


def ingest(
    source: Source,
    catalog: Catalog,
    namespace: str,
    decoder: Decoder,
    batch_size: int,
    on_batch: Callable[[IngestStats], None] | None = None,
    max_records: int | None = None,
) -> IngestStats:
    """Ingest until the source is caught up (or `max_records` were read)."""
    sinks = Sinks(catalog, namespace)
    source.seek(sinks.resume_positions())
    stats = IngestStats()
    while max_records is None or stats.records < max_records:
        limit = batch_size if max_records is None else min(batch_size, max_records - stats.records)
        batch = source.poll(limit)
        if not batch:
            break
        _ingest_batch(batch, sinks, decoder, stats)
        source.commit(stats.positions)
        if on_batch:
            on_batch(stats)
    # Tables that received nothing lately still record how far the run got, so the next
    # run does not re-read from their older positions.
    for name, held in list(sinks.positions.items()):
        if any(held.get(s, 0) < p for s, p in stats.positions.items()):
            sinks.commit(name, sinks.tables[name].schema().as_arrow().empty_table(), stats.positions)
    return stats


def _ingest_batch(batch: list[SourceRecord], sinks: Sinks, decoder: Decoder, stats: IngestStats) -> None:
    now = datetime.now(timezone.utc)
    events: dict[str, list[ChangeEvent]] = defaultdict(list)
    letters: dict[str, list[DeadLetter]] = defaultdict(list)
    for record in batch:
        out = decoder.decode(record)
        if isinstance(out, DeadLetter):
            log.warning("dead letter for table %s at %s: %s: %s", out.table, record.where(), out.reason, out.detail)
            letters[out.table + DEAD_LETTERS_SUFFIX].append(out)
        else:
            events[out.table + LOG_SUFFIX].append(out)
    batch_positions = dict(stats.positions)
    for r in batch:
        batch_positions[r.stream] = max(batch_positions.get(r.stream, 0), r.sequence_number + 1)

    for groups, schema, to_rows, counter in (
        (events, LOG_SCHEMA, log_rows, stats.accepted),
        (letters, DEAD_LETTER_SCHEMA, dead_letter_rows, stats.dead_letters),
    ):
        for name, items in groups.items():
            sinks.get(name, schema)
            held = sinks.positions[name]
            fresh = [i for i in items if i.record.sequence_number >= held.get(i.record.stream, 0)]
            stats.duplicates += len(items) - len(fresh)
            sinks.commit(name, to_rows(fresh, now), batch_positions)
            counter[name.rsplit("__", 1)[0]] += len(fresh)
    stats.records += len(batch)
    stats.batches += 1
    stats.positions = batch_positions

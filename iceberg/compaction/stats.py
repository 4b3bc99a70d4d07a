"""Per-stream statistics the planner and `status` need, read with pyiceberg (no Spark)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import And, GreaterThan, GreaterThanOrEqual
from pyiceberg.table import DataScan, FileScanTask, Table

from iceberg import compat
from iceberg.compaction.policy import CompactionPolicy, StreamStats
from iceberg.compaction.report import utc
from iceberg.layouts import TableNames
from iceberg.log_writer import committed_positions
from iceberg.summary_keys import CLEANER_POINTS, STREAM_BYTES


def load_optional(catalog: Catalog, name: str) -> Table | None:
    try:
        return catalog.load_table(name)
    except NoSuchTableError:
        return None


def cleaner_points(state: Table | None) -> dict[str, int]:
    return (CLEANER_POINTS.read(state) if state is not None else None) or {}


# Rows the planner reads at once, about: it reads the log's dirty range (and the state) a few
# files at a time and keeps running totals, so a backlog of any size is planned in bounded memory.
CHUNK_ROWS = 500_000


def _chunks(scan: DataScan, rows: int, order_by: str | None = None) -> Iterator[pa.Table]:
    """The scan's rows a few files at a time, about `rows` rows (before its filter) per chunk:
    pyiceberg's `to_arrow` and `to_arrow_batch_reader` both read every file of a scan at once.
    With `order_by` (a long column), files go in the order of that column's lower bound, so
    the chunks of a log follow it (Spark writes a batch as several files, listed in any order)."""
    read = compat.file_reader(scan)
    tasks = list(scan.plan_files())
    if order_by is not None:
        field = scan.table_metadata.schema().find_field(order_by).field_id

        def low(task: FileScanTask) -> int:
            bound = (task.file.lower_bounds or {}).get(field)
            return int.from_bytes(bound, "little", signed=True) if bound else -(1 << 63)

        tasks.sort(key=low)
    chunk: list[FileScanTask] = []
    held = 0
    for task in tasks:
        if chunk and held + task.file.record_count > rows:
            yield read(chunk)
            chunk, held = [], 0
        chunk.append(task)
        held += task.file.record_count
    if chunk:
        yield read(chunk)


def clean_bytes(*tables: Table | None) -> dict[str, int]:
    """Bytes (key + payload) held per stream by the state and tombstone tables (read a chunk
    of files at a time, like the log)."""
    out: dict[str, int] = defaultdict(int)
    for t in tables:
        if t is None:
            continue
        for rows in _chunks(t.scan(selected_fields=("_topic", "_partition_id", "_payload_bytes")), CHUNK_ROWS):
            grouped = rows.group_by(["_topic", "_partition_id"]).aggregate([("_payload_bytes", "sum")])
            for topic, part, n in zip(*(grouped.column(i).to_pylist() for i in range(3))):
                out[f"{topic}:{part}"] += n or 0
    return out


def recorded_bytes(table: Table | None) -> dict[str, int] | None:
    """The bytes per stream the table's newest commit that recorded them says it holds
    (metadata only); None for a table with rows and no record (written by an older version)."""
    if table is None or table.current_snapshot() is None:
        return {}
    held = STREAM_BYTES.read(table)
    if held is None:
        summary = table.current_snapshot().summary  # type: ignore[union-attr]
        rows = int(summary.additional_properties.get("total-records", 1)) if summary else 1
        return {} if rows == 0 else None
    return held


def sum_streams(*counts: dict[str, int]) -> dict[str, int]:
    """Per stream, the sum of its counts."""
    out: dict[str, int] = defaultdict(int)
    for c in counts:
        for stream, n in c.items():
            out[stream] += n
    return dict(out)


def held_bytes(*tables: Table | None) -> dict[str, int]:
    """Bytes per stream the state and tombstone tables hold: as each one's commits recorded
    them, or, for one written without a record, counted from its rows."""
    return sum_streams(*(b if (b := recorded_bytes(t)) is not None else clean_bytes(t) for t in tables))


def logged_bytes(log: Table, points: dict[str, int]) -> dict[str, int]:
    """Bytes per stream in the log at or past the stream's cleaner point (all of it without one)."""
    streams = sorted(committed_positions(log))
    out: dict[str, int] = defaultdict(int)
    if not streams:
        return out
    dirty = GreaterThanOrEqual("sequence_number", min(points.get(s, 0) for s in streams))  # type: ignore[call-arg,misc]
    columns = ("topic", "partition", "sequence_number", "payload_bytes")
    for rows in _chunks(log.scan(row_filter=dirty, selected_fields=columns), CHUNK_ROWS):
        for stream, mine in _per_stream(rows, points, streams):
            out[stream] += int(pc.sum(mine["payload_bytes"]).as_py() or 0)
    return out


def log_start(log: Table) -> dict[str, int]:
    """The oldest sequence number the log still holds, per stream (log retention trims it)."""
    out: dict[str, int] = {}
    for rows in _chunks(log.scan(selected_fields=("topic", "partition", "sequence_number")), CHUNK_ROWS):
        if rows.num_rows:
            g = rows.group_by(["topic", "partition"]).aggregate([("sequence_number", "min")])
            for topic, part, first in zip(*(g.column(i).to_pylist() for i in range(3))):
                key = f"{topic}:{part}"
                out[key] = min(out.get(key, first), first)
    return out


@dataclass
class _Dirty:
    """One stream's running totals over the dirty range, chunk by chunk (order-free)."""

    bytes: int = 0
    events: int = 0
    first_time: datetime | None = None
    last_cleanable_time: datetime | None = None
    young_time: datetime | None = None
    max_seq: int | None = None
    cleanable_bytes: int = 0
    cleanable_events: int = 0
    bounds: dict[str, Any] | None = None
    truncates: int = 0
    segments: list[Segment | None] = field(default_factory=list)


@dataclass(frozen=True)
class Segment:
    """Some changes of one stream (a chunk's), in sequence-number order, as their order keys
    without the log position: `(position..., rank)`, a position-less change taking the
    position before it in the stream. `lead` are the ranks of the position-less changes
    before the segment's first position (they take the previous segment's last one)."""

    seq_min: int
    seq_max: int
    ordered: bool  # each change no older than the one before it, within the segment
    first: tuple[Any, ...] | None  # the first positioned change's (position..., rank)
    last: tuple[Any, ...] | None  # the last change's, position carried
    lead: tuple[int, int] | None  # (first, last) rank of the leading position-less changes


def segment(seq: np.ndarray, positions: pa.Array, snapshot: np.ndarray, ordering: str) -> Segment | None:
    """The segment of a stream's changes (any order); None when positions differ in length
    (such a round does not pack, and only the packed route needs to know)."""
    order = np.argsort(seq, kind="stable")
    rank = (~snapshot[order]).astype(np.int64)
    n = len(order)
    if ordering == "log":
        keys = rank[:, None]
        valid = np.ones(n, bool)
    else:
        taken = positions.take(pa.array(order))
        valid = taken.is_valid().to_numpy(zero_copy_only=False)
        lengths = set(pc.unique(pc.list_value_length(taken).drop_null()).to_pylist())
        if len(lengths) > 1:
            return None
        width = lengths.pop() if lengths else 0
        flat = (
            pc.list_flatten(taken).to_numpy(zero_copy_only=False).reshape(-1, width)
            if width
            else np.zeros((int(valid.sum()), 0), np.int64)
        )
        # a position-less change takes the last position before it (carried, as the job does)
        last = np.maximum.accumulate(np.where(valid, np.arange(n), -1))
        carried = np.cumsum(valid) - 1
        known = last >= 0
        keys = np.zeros((n, width + 1), np.int64)
        keys[known, :width] = flat[carried[known]]
        keys[:, width] = rank
        lead_n = int(np.argmax(known)) if known.any() else n
        lead = (int(rank[0]), int(rank[lead_n - 1])) if lead_n else None
        ordered = bool(np.all(np.diff(rank[:lead_n]) >= 0))
        keys = keys[lead_n:]
        ordered = ordered and _non_decreasing(keys)
        first = tuple(map(int, keys[0])) if len(keys) else None
        return Segment(
            int(seq[order[0]]),
            int(seq[order[-1]]),
            ordered,
            first,
            tuple(map(int, keys[-1])) if len(keys) else None,
            lead,
        )
    return Segment(
        int(seq[order[0]]),
        int(seq[order[-1]]),
        _non_decreasing(keys),
        tuple(map(int, keys[0])),
        tuple(map(int, keys[-1])),
        None,
    )


def _non_decreasing(keys: np.ndarray) -> bool:
    """Whether the rows of `keys` are in lexicographic order."""
    if len(keys) < 2:
        return True
    d = np.diff(keys, axis=0)
    nonzero = d != 0
    first = np.argmax(nonzero, axis=1)
    return bool(np.all(d[np.arange(len(d)), first] >= 0))


def in_order(segments: Sequence[Segment | None]) -> bool:
    """Whether a stream's segments, taken together, are in order (unknown: no)."""
    known = [s for s in segments if s is not None]
    if len(known) < len(segments):
        return False
    carry: tuple[Any, ...] | None = None
    high = None
    for s in sorted(known, key=lambda s: s.seq_min):
        if not s.ordered or (high is not None and s.seq_min <= high):
            return False
        high = s.seq_max
        if s.lead is not None and carry is not None:
            if carry[-1] > s.lead[0]:
                return False
            carry = (*carry[:-1], s.lead[1])
        if s.first is not None and carry is not None and carry > s.first:
            return False
        carry = s.last if s.last is not None else carry
    return True


def _per_stream(rows: pa.Table, points: dict[str, int], streams: list[str]) -> Iterator[tuple[str, pa.Table]]:
    """Each stream's rows of a chunk at or past its cleaner point. Only the streams the chunk
    holds are filtered for: a table's log records the positions of every stream its ingest
    run read (200 for a table of a topic of 2 partitions among 100), and a filter per stream
    and chunk made the plan of such a table 0.24 s."""
    present = rows.group_by(["topic", "partition"]).aggregate([])
    held = {f"{t}:{p}" for t, p in zip(present["topic"].to_pylist(), present["partition"].to_pylist())}
    for stream in (s for s in streams if s in held):
        topic, part = stream.rsplit(":", 1)
        mine = rows.filter(
            pc.and_(
                pc.and_(pc.equal(rows["topic"], topic), pc.equal(rows["partition"], int(part))),
                pc.greater_equal(rows["sequence_number"], points.get(stream, 0)),
            )
        )
        if mine.num_rows:
            yield stream, mine


def stream_stats(
    catalog: Catalog,
    names: TableNames,
    policy: CompactionPolicy,
    now: datetime,
    bounds: bool = False,
    chunk_rows: int = CHUNK_ROWS,
    clean: dict[str, int] | None = None,
    loaded: Mapping[str, Table | None] | None = None,
) -> list[StreamStats]:
    """Per stream; with `bounds`, also the cleanable range's packing bounds and truncates,
    from the same scan (the compaction job's first step reads no more than this). `clean`:
    the bytes the state and tombstones hold per stream, when the caller has read them;
    `loaded`: the log and the state (None: none yet) as the caller loaded them, by name."""
    loaded = loaded or {}
    log = loaded.get(names.log) or catalog.load_table(names.log)
    state = loaded[names.state] if names.state in loaded else load_optional(catalog, names.state)
    points = cleaner_points(state)
    streams = sorted(set(committed_positions(log)) | set(points))
    if not streams:
        return []
    # pyiceberg's expressions take (term, literal); the pydantic mypy plugin reads them as keyword-only
    dirty = GreaterThanOrEqual("sequence_number", min(points.get(s, 0) for s in streams))  # type: ignore[call-arg,misc]
    # A stream's cleanable range ends before its first event younger than min_compaction_lag
    # (files without one are skipped by their enqueued_time bounds); a naive `now` is UTC.
    cutoff = utc(now) - policy.min_compaction_lag
    young: dict[str, int] = {}
    for rows in _chunks(
        log.scan(
            row_filter=And(dirty, GreaterThan("enqueued_time", cutoff.isoformat())),  # type: ignore[call-arg,misc]
            selected_fields=("topic", "partition", "sequence_number"),
        ),
        chunk_rows,
    ):
        for stream, mine in _per_stream(rows, points, streams):
            first = pc.min(mine["sequence_number"]).as_py()
            young[stream] = min(young.get(stream, first), first)
    columns = ("topic", "partition", "sequence_number", "payload_bytes", "enqueued_time") + (
        ("op", "source_position", "snapshot") if bounds else ()
    )
    totals = {s: _Dirty() for s in streams}
    for rows in _chunks(log.scan(row_filter=dirty, selected_fields=columns), chunk_rows, "sequence_number"):
        for stream, mine in _per_stream(rows, points, streams):
            _add(totals[stream], mine, young.get(stream), policy if bounds else None)
    if clean is None:
        clean = held_bytes(state, load_optional(catalog, names.tombstones))
    out = []
    none = _bounds(log.schema().select(*columns).as_arrow().empty_table(), policy)["bounds"] if bounds else None
    for stream, d in totals.items():
        point = points.get(stream, 0)
        end = young.get(stream, d.max_seq + 1 if d.max_seq is not None else point)
        planned: dict[str, Any] = {}
        if bounds:
            planned = {
                "bounds": d.bounds or none,
                "truncates": d.truncates,
                "monotone": in_order(d.segments),
            }
        out.append(
            StreamStats(
                stream=stream,
                cleaner_point=point,
                clean_bytes=clean.get(stream, 0),
                dirty_bytes=d.bytes,
                cleanable_bytes=d.cleanable_bytes,
                cleanable_end=end,
                first_dirty_time=d.first_time,
                dirty_events=d.events,
                cleanable_events=d.cleanable_events,
                last_cleanable_time=d.last_cleanable_time,
                young_time=d.young_time,
                dirty_end=d.max_seq + 1 if d.max_seq is not None else point,
                **planned,
            )
        )
    return out


def _add(d: _Dirty, mine: pa.Table, end: int | None, policy: CompactionPolicy | None) -> None:
    """Adds a chunk of one stream's dirty events to its totals; `end`: where its cleanable range ends."""
    first, top = pc.min(mine["enqueued_time"]).as_py(), pc.max(mine["sequence_number"]).as_py()
    d.bytes += int(pc.sum(mine["payload_bytes"]).as_py() or 0)
    d.events += mine.num_rows
    d.first_time = first if d.first_time is None else min(d.first_time, first)
    d.max_seq = top if d.max_seq is None else max(d.max_seq, top)
    cleanable = mine if end is None else mine.filter(pc.less(mine["sequence_number"], end))
    if cleanable.num_rows < mine.num_rows:
        young = pc.min(mine.filter(pc.greater_equal(mine["sequence_number"], end))["enqueued_time"]).as_py()
        d.young_time = young if d.young_time is None else min(d.young_time, young)
    d.cleanable_bytes += int(pc.sum(cleanable["payload_bytes"]).as_py() or 0)
    d.cleanable_events += cleanable.num_rows
    if cleanable.num_rows:
        last = pc.max(cleanable["enqueued_time"]).as_py()
        d.last_cleanable_time = last if d.last_cleanable_time is None else max(d.last_cleanable_time, last)
    if policy is not None and cleanable.num_rows:
        from iceberg.compaction.dedupe import merge_bounds

        got = _bounds(cleanable, policy)
        d.bounds = got["bounds"] if d.bounds is None else merge_bounds(d.bounds, got["bounds"])
        d.truncates += got["truncates"]
        events = cleanable.filter(pc.not_equal(cleanable["op"], "t").fill_null(True))
        if events.num_rows:
            d.segments.append(
                segment(
                    events["sequence_number"].to_numpy(),
                    events["source_position"].combine_chunks(),
                    events["snapshot"].to_numpy(),
                    policy.ordering,
                )
            )


def _bounds(rows: pa.Table, policy: CompactionPolicy) -> dict[str, Any]:
    from iceberg.compaction.dedupe import arrow_bounds  # Spark's module: only the job asks for bounds

    truncate = pc.equal(rows["op"], "t").fill_null(False)
    events = rows.select(["source_position", "partition", "sequence_number"]).filter(pc.invert(truncate))
    position = (
        events["source_position"]
        if policy.ordering == "source"
        else pa.nulls(events.num_rows, events.schema.field("source_position").type)
    )
    return {
        "bounds": arrow_bounds(position, events["partition"], events["sequence_number"]),
        "truncates": pc.sum(truncate.cast(pa.int64())).as_py() or 0,
    }

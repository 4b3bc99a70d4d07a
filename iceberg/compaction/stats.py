"""Per-stream statistics the planner and `status` need, read with pyiceberg (no Spark)."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import GreaterThanOrEqual
from pyiceberg.table import Table

from iceberg.compaction.policy import CompactionPolicy, StreamStats
from iceberg.layouts import TableNames
from iceberg.log_writer import committed_positions, summary_value

CLEANER_POINTS_PROPERTY = "cdclake.cleaner-points"


def load_optional(catalog: Catalog, name: str) -> Table | None:
    try:
        return catalog.load_table(name)
    except NoSuchTableError:
        return None


def cleaner_points(state: Table | None) -> dict[str, int]:
    raw = summary_value(state, CLEANER_POINTS_PROPERTY) if state is not None else None
    return {k: int(v) for k, v in json.loads(raw).items()} if raw else {}


def clean_bytes(*tables: Table | None) -> dict[str, int]:
    """Bytes (key + payload) held per stream by the state and tombstone tables."""
    out: dict[str, int] = defaultdict(int)
    for t in tables:
        if t is None:
            continue
        rows = t.scan(selected_fields=("_topic", "_partition_id", "_payload_bytes")).to_arrow()
        if rows.num_rows == 0:
            continue
        grouped = rows.group_by(["_topic", "_partition_id"]).aggregate([("_payload_bytes", "sum")])
        for topic, part, n in zip(*(grouped.column(i).to_pylist() for i in range(3))):
            out[f"{topic}:{part}"] += n or 0
    return out


def stream_stats(catalog: Catalog, names: TableNames, policy: CompactionPolicy, now: datetime,
                 bounds: bool = False) -> list[StreamStats]:
    """Per stream; with `bounds`, also the cleanable range's packing bounds and truncates,
    from the same scan (the compaction job's first step reads no more than this)."""
    log = catalog.load_table(names.log)
    state = load_optional(catalog, names.state)
    points = cleaner_points(state)
    streams = sorted(set(committed_positions(log)) | set(points))
    if not streams:
        return []
    low = min(points.get(s, 0) for s in streams)
    rows = log.scan(
        row_filter=GreaterThanOrEqual("sequence_number", low),
        selected_fields=("topic", "partition", "sequence_number", "payload_bytes", "enqueued_time")
        + (("op", "source_position") if bounds else ()),
    ).to_arrow()
    clean = clean_bytes(state, load_optional(catalog, names.tombstones))
    cutoff = pa.scalar(now - policy.min_compaction_lag, type=pa.timestamp("us", tz="UTC"))
    out = []
    for stream in streams:
        topic, part = stream.rsplit(":", 1)
        point = points.get(stream, 0)
        mine = rows.filter(
            pc.and_(pc.and_(pc.equal(rows["topic"], topic), pc.equal(rows["partition"], int(part))),
                    pc.greater_equal(rows["sequence_number"], point))
        )
        young = mine.filter(pc.greater(mine["enqueued_time"], cutoff))
        if young.num_rows:
            end = pc.min(young["sequence_number"]).as_py()
        else:
            end = (pc.max(mine["sequence_number"]).as_py() + 1) if mine.num_rows else point
        cleanable = mine.filter(pc.less(mine["sequence_number"], end))
        out.append(StreamStats(
            stream=stream,
            cleaner_point=point,
            clean_bytes=clean.get(stream, 0),
            dirty_bytes=int(pc.sum(mine["payload_bytes"]).as_py() or 0),
            cleanable_bytes=int(pc.sum(cleanable["payload_bytes"]).as_py() or 0),
            cleanable_end=end,
            first_dirty_time=pc.min(mine["enqueued_time"]).as_py() if mine.num_rows else None,
            dirty_events=mine.num_rows,
            cleanable_events=cleanable.num_rows,
            **(_bounds(cleanable, policy) if bounds else {}),
        ))
    return out


def _bounds(rows: pa.Table, policy: CompactionPolicy) -> dict:
    from iceberg.compaction.dedupe import arrow_bounds  # Spark's module: only the job asks for bounds

    truncate = pc.equal(rows["op"], "t").fill_null(False)
    events = rows.select(["source_position", "partition", "sequence_number"]).filter(pc.invert(truncate))
    position = (events["source_position"] if policy.ordering == "source"
                else pa.nulls(events.num_rows, events.schema.field("source_position").type))
    return {"bounds": arrow_bounds(position, events["partition"], events["sequence_number"]),
            "truncates": pc.sum(truncate.cast(pa.int64())).as_py() or 0}

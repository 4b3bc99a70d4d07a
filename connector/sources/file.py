"""Replay of a topic dump in kcat's `-J` JSON-lines envelope.

One JSON object per line: `topic`, `partition`, `offset`, `ts` (ms), `key`, `payload`
(null is a tombstone), `headers` (kcat's flat `[k, v, k, v]` list, or an object). Event
Hubs fields are used when present: `sequence_number`, `enqueued_time` (ISO text or ms),
`partition_key` (preferred over `key`), and `offset` as the Event Hubs offset text.

The driver cuts the file into ranges of whole lines (`plan_ranges`: byte offsets and line
numbers only); the executors read them in the decode stage (`read_ranges`). A range of
plain kcat lines (numeric offsets and ms timestamps, string key and payload, no
headers) is read by Arrow's JSON reader, without a Python object per line; any other range
line by line.

A line that is not a kcat record (not JSON, truncated, an offset or time out of range) is a
record of the file's own stream `cdclake.file.<file name stem>:0` whose offset is its line
number, carrying the raw line and the reason in a `cdclake.source-error` header: it becomes
a dead letter (reason `source`) of table `<stem>`, and the stream goes on.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import glob
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from connector.core.errors import SourceError
from connector.core.records import SOURCE_ERROR_HEADER, SourceRecord
from connector.sources import Source

# The plain kcat -J shape; the other fields must be absent (null) for the Arrow reader.
_PLAIN = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int64()),
        ("offset", pa.int64()),
        ("ts", pa.int64()),
        ("key", pa.string()),
        ("payload", pa.string()),
    ]
)
_OTHER = pa.schema(
    [
        ("headers", pa.string()),
        ("sequence_number", pa.string()),
        ("enqueued_time", pa.string()),
        ("partition_key", pa.string()),
    ]
)
RANGE_BYTES = 8 << 20  # bytes of lines per range (one task of a Spark batch)
MAX_LINE_BYTES = 64 << 20


def _bytes(v: Any) -> bytes | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode()
    return orjson.dumps(v)  # kcat -s avro prints decoded objects


INT32_MAX, INT64_MAX = (1 << 31) - 1, (1 << 63) - 1
_MAX_TS_MS = 253402300799999  # 9999-12-31T23:59:59.999Z


def _count(v: Any, what: str, top: int) -> int:
    """A partition / offset / sequence number: an integer from 0 to `top` (or its digits)."""
    if type(v) is str and v.isascii() and v.isdigit():
        v = int(v)
    if type(v) is not int or not 0 <= v <= top:
        raise ValueError(f"{what} {v!r} is not an integer from 0 to {top}")
    return v


def _time(v: Any) -> datetime:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if not 0 <= v <= _MAX_TS_MS:
            raise ValueError(f"timestamp {v!r} ms is out of range")
        return datetime.fromtimestamp(v / 1000, tz=UTC)
    t = datetime.fromisoformat(str(v).replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _headers(v: Any) -> tuple[tuple[str, bytes | None], ...]:
    if not v:
        return ()
    if isinstance(v, dict):
        return tuple((str(k), _bytes(x)) for k, x in v.items())
    return tuple((str(v[i]), _bytes(v[i + 1])) for i in range(0, len(v) - 1, 2))


def parse_line(doc: Mapping[str, Any], default_topic: str | None = None) -> SourceRecord:
    if type(doc) is not dict:
        raise TypeError(f"a JSON {type(doc).__name__}, not an object")
    topic = doc.get("topic") or default_topic
    if not topic or type(topic) is not str:
        raise KeyError("topic")
    offset = doc["offset"] if "offset" in doc else doc["sequence_number"]
    seq = doc.get("sequence_number", offset)
    when = doc.get("enqueued_time", doc.get("ts"))
    return SourceRecord(
        topic=topic,
        partition=_count(doc.get("partition", 0), "partition", INT32_MAX),
        offset=str(offset),
        sequence_number=_count(seq, "offset", INT64_MAX),
        enqueued_time=_time(when) if when is not None else datetime.now(UTC),
        key=_bytes(doc.get("partition_key", doc.get("key"))),
        value=_bytes(doc.get("payload")),
        headers=_headers(doc.get("headers")),
    )


def _bad_line(name: str, own_topic: str, n: int, line: bytes, e: Exception) -> SourceRecord:
    why = (
        f"{name}:{n}: not a kcat -J record ({type(e).__name__}: {e}); each line needs "
        "topic (or source.topic), partition, offset, payload"
    )
    return SourceRecord(
        own_topic, 0, str(n), n, datetime.now(UTC), None, line.rstrip(b"\r\n"), ((SOURCE_ERROR_HEADER, why.encode()),)
    )


@dataclass(frozen=True)
class FileRange:
    """`lines` whole lines from `first_line`, bytes [start, end) of a file: one task's share."""

    path: str
    start: int
    end: int
    first_line: int
    lines: int


def _cut(block: bytes, max_lines: int) -> list[bytes]:
    """`block` (whole lines) in pieces of at most `max_lines` lines."""
    out, pos = [], 0
    while pos < len(block):
        end = pos
        for _ in range(max_lines):
            j = block.find(b"\n", end)
            end = len(block) if j < 0 else j + 1
            if j < 0:
                break
        out.append(block[pos:end])
        pos = end
    return out


def _newlines(data: bytes) -> int:
    return int(np.count_nonzero(np.frombuffer(data, np.uint8) == 10))


def plan_ranges(path: Path, max_lines: int | None = None, target_bytes: int = RANGE_BYTES) -> list[FileRange]:
    """The file cut at line ends into ranges of about `target_bytes` and at most `max_lines`
    lines (one pass, one block in memory)."""
    out: list[FileRange] = []
    with path.open("rb") as f:
        start, line = 0, 1
        while True:
            block = f.read(target_bytes)
            if not block:
                return out
            if not block.endswith(b"\n"):
                block += f.readline()
            pieces = [block] if max_lines is None or _newlines(block) <= max_lines else _cut(block, max_lines)
            for piece in pieces:
                n = _newlines(piece) + (not piece.endswith(b"\n"))
                out.append(FileRange(str(path), start, start + len(piece), line, n))
                start, line = start + len(piece), line + n


def read_range(r: FileRange, default_topic: str | None = None, max_line_bytes: int = MAX_LINE_BYTES) -> pa.Table:
    """The records of a range (`RECORD_SCHEMA`), in file order. Plain kcat lines are read
    with Arrow's JSON reader; a range that has any other line is read line by line."""
    with Path(r.path).open("rb") as f:
        f.seek(r.start)
        data = f.read(r.end - r.start)
    table = _plain(data, default_topic) if len(data) <= max_line_bytes else None  # else a line may be over
    return table if table is not None else _lines(data, r, default_topic, max_line_bytes)


def _lines(data: bytes, r: FileRange, default_topic: str | None, max_line_bytes: int) -> pa.Table:
    """The range's records, line by line (`RECORD_SCHEMA`)."""
    from connector.batch import RecordBatch

    path = Path(r.path)
    records = []
    for n, line in enumerate(data.splitlines(keepends=True), r.first_line):
        if not line.strip():
            continue
        try:
            if len(line) > max_line_bytes:
                raise ValueError(
                    f"the line has {len(line):,} bytes, over the file source's limit of {max_line_bytes:,}"
                )
            records.append(parse_line(orjson.loads(line), default_topic))
        except (orjson.JSONDecodeError, KeyError, ValueError, TypeError, OverflowError, OSError) as e:
            records.append(_bad_line(path.name, own_topic(path), n, line, e))
    return RecordBatch.of(records).table


def own_topic(path: Path) -> str:
    """The topic of a file's own stream, where lines that are not records go."""
    return f"cdclake.file.{path.stem}"


def _objects_or_blank(data: bytes) -> bool:
    """Every line of `data` starts with `{` or is empty."""
    a = np.frombuffer(data, np.uint8)
    starts = np.flatnonzero(a[:-1] == 10) + 1
    return bool(a[0] in b"{\n" and np.all((a[starts] == 123) | (a[starts] == 10)))


def _plain(data: bytes, default_topic: str | None) -> pa.Table | None:
    """Lines of the plain kcat -J shape as records (`RECORD_SCHEMA`), or None if any line is not."""
    from connector.batch import RECORD_SCHEMA

    if not data or data.isspace():
        return RECORD_SCHEMA.empty_table()
    if not _objects_or_blank(data):
        return None  # a line that is not an object (Arrow's reader crashes on a bare `null`)
    try:
        raw = pj.read_json(
            pa.BufferReader(data),
            read_options=pj.ReadOptions(block_size=max(len(data), 1 << 20), use_threads=False),  # a task, a core
            parse_options=pj.ParseOptions(
                explicit_schema=pa.unify_schemas([_PLAIN, _OTHER]), unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    topic = raw.column("topic")
    partition, offset, ts = raw.column("partition"), raw.column("offset"), raw.column("ts")
    if (
        any(raw.column(f.name).null_count < raw.num_rows for f in _OTHER)
        or partition.null_count
        or offset.null_count
        or pc.any(pc.equal(topic, "")).as_py()
        or (topic.null_count and not default_topic)
        or pc.min(offset).as_py() < 0
        or pc.min(partition).as_py() < 0
        or pc.max(partition).as_py() > INT32_MAX
        or (ts.null_count < raw.num_rows and (pc.min(ts).as_py() < 0 or pc.max(ts).as_py() > _MAX_TS_MS))
    ):
        return None
    topic = topic.fill_null(default_topic) if topic.null_count else topic
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    return pa.Table.from_arrays(
        [
            topic,
            partition.cast(pa.int32()),
            offset.cast(pa.string()),
            offset,
            pc.multiply(ts.fill_null(now_ms), 1000)
            .cast(pa.timestamp("us"))
            .cast(RECORD_SCHEMA.field("enqueued_time").type),
            raw.column("key").cast(pa.binary()),
            raw.column("payload").cast(pa.binary()),
            pa.nulls(raw.num_rows, RECORD_SCHEMA.field("headers").type),
        ],
        schema=RECORD_SCHEMA,
    )


def dump_files(path: str | Path) -> list[Path]:
    """The dumps `path` names: one file, every file of a directory, or a glob's files, in name order."""
    p = Path(path)
    if p.is_file():
        return [p]
    found = p.iterdir() if p.is_dir() else map(Path, glob.glob(str(p)))
    files = sorted(f for f in found if f.is_file())
    if not files:
        raise SourceError(
            f"source.path: no such file {str(path)!r}; give a kcat -J dump (JSON lines), a directory of them or a glob"
        )
    return files


class FileSource(Source):
    """The dump read by Spark: ranges of lines, planned once per pass on the driver and read
    on the executors, as many per batch as hold at most the batch's number of records."""

    def __init__(self, path: str | Path, default_topic: str | None = None, max_line_bytes: int = MAX_LINE_BYTES):
        self.files = dump_files(path)
        self.default_topic, self.max_line_bytes = default_topic, max_line_bytes
        self._ranges: collections.deque[FileRange] | None = None
        self._positions: dict[str, int] = {}

    def seek(self, positions: Mapping[str, int]) -> None:
        self._positions = dict(positions)
        self._ranges = None

    def next_frame(self, spark: Any, max_events: int) -> Any:
        if self._ranges is None:  # at least two ranges a batch, for two tasks
            lines = max(1, max_events // 2)
            self._ranges = collections.deque(r for f in self.files for r in plan_ranges(f, lines))
        take: list[FileRange] = []
        while self._ranges and (not take or sum(r.lines for r in take) + self._ranges[0].lines <= max_events):
            take.append(self._ranges.popleft())
        if not take:
            return None
        rows = [dataclasses.astuple(r) for r in take]
        return spark.createDataFrame(rows, RANGE_COLUMNS)

    def expand(self) -> Callable[[pa.Table], pa.Table]:
        return functools.partial(read_ranges, self.default_topic, self.max_line_bytes, dict(self._positions))


# A batch of the file as Spark holds it: one row per range (one task each); the decode stage
# reads the lines itself (`read_ranges`), so records cross from Python to the JVM once.
RANGE_COLUMNS = "path string, start bigint, end bigint, first_line bigint, lines bigint"


def read_ranges(
    default_topic: str | None, max_line_bytes: int, positions: Mapping[str, int], ranges: pa.Table
) -> pa.Table:
    """The records (`RECORD_SCHEMA`) of a table of ranges (`RANGE_COLUMNS`), below `positions` left out."""
    from connector.batch import at_or_after

    parts = [read_range(FileRange(**r), default_topic, max_line_bytes) for r in ranges.to_pylist()]
    table = pa.concat_tables(parts)
    return table.filter(at_or_after(table, positions)) if positions and table.num_rows else table


__all__ = ["FileRange", "FileSource", "parse_line", "plan_ranges", "read_range", "read_ranges"]

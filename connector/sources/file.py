"""Replay of a topic dump in kcat's `-J` JSON-lines envelope.

One JSON object per line: `topic`, `partition`, `offset`, `ts` (ms), `key`, `payload`
(null is a tombstone), `headers` (kcat's flat `[k, v, k, v]` list, or an object). Event
Hubs fields are used when present: `sequence_number`, `enqueued_time` (ISO text or ms),
`partition_key` (preferred over `key`), and `offset` as the Event Hubs offset text.

`poll_batch` reads plain kcat dumps (numeric offsets and ms timestamps, string key and
payload, no headers) with Arrow's JSON reader, without a Python object per line; from the
first block that does not fit that shape on, it continues with the per-line reader.

A line that is not a kcat record (not JSON, truncated, an offset or time out of range) is a
record of the file's own stream `cdclake.file.<file name stem>:0` whose offset is its line
number, carrying the raw line and the reason in a `cdclake.source-error` header: it becomes
a dead letter (reason `source`) of table `<stem>`, and the stream goes on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from connector.core.errors import SourceError
from connector.core.records import SOURCE_ERROR_HEADER, SourceRecord
from connector.sources import Source

if TYPE_CHECKING:
    from connector.batch import RecordBatch

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
_BLOCK = 8 << 20


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


class FileSource(Source):
    """Reads the whole file once; records below the seek positions are skipped."""

    def __init__(self, path: str | Path, default_topic: str | None = None, max_line_bytes: int = 64 << 20):
        self.path = Path(path)
        self.max_line_bytes = max_line_bytes
        if not self.path.is_file():
            raise SourceError(f"source.path: no such file {str(self.path)!r}; give a kcat -J dump (JSON lines)")
        self.default_topic = default_topic
        self.seek({})

    def seek(self, positions: Mapping[str, int]) -> None:
        self._positions = dict(positions)
        self._lines: Iterator[SourceRecord] | None = None
        self._reader: Any = None
        self._rest: pa.Table | None = None
        self._mode, self._parsed = "arrow", 0  # then "lines" or "done"; lines the Arrow reader took

    @property
    def own_topic(self) -> str:
        """The topic of the file's own stream, where lines that are not records go."""
        return f"cdclake.file.{self.path.stem}"

    def _records(self, skip: int = 0) -> Iterator[SourceRecord]:
        with self.path.open("rb") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if skip:
                    skip -= 1
                    continue
                try:
                    if len(line) > self.max_line_bytes:
                        raise ValueError(
                            f"the line has {len(line):,} bytes, over the file source's limit of {self.max_line_bytes:,}"
                        )
                    record = parse_line(orjson.loads(line), self.default_topic)
                except (orjson.JSONDecodeError, KeyError, ValueError, TypeError, OverflowError, OSError) as e:
                    why = (
                        f"{self.path.name}:{n}: not a kcat -J record ({type(e).__name__}: {e}); each line needs "
                        "topic (or source.topic), partition, offset, payload"
                    )
                    record = SourceRecord(
                        self.own_topic,
                        0,
                        str(n),
                        n,
                        datetime.now(UTC),
                        None,
                        line.rstrip(b"\r\n"),
                        ((SOURCE_ERROR_HEADER, why.encode()),),
                    )
                if record.sequence_number >= self._positions.get(record.stream, 0):
                    yield record

    def poll(self, max_records: int) -> list[SourceRecord]:
        if self._lines is None:
            self._lines = self._records()
        out = []
        for record in self._lines:
            out.append(record)
            if len(out) >= max_records:
                break
        return out

    def poll_batch(self, max_records: int) -> RecordBatch:
        from connector.batch import RecordBatch

        parts, n = [], 0
        while self._mode == "arrow" and n < max_records:
            block = self._rest if self._rest is not None else self._next_block()
            self._rest = None
            if block is None:
                break
            if block.num_rows > max_records - n:
                block, self._rest = block.slice(0, max_records - n), block.slice(max_records - n)
            parts.append(block)
            n += block.num_rows
        if self._mode == "lines" and n < max_records:
            if self._lines is None:
                self._lines = self._records(skip=self._parsed)
            slow = RecordBatch.of(self.poll(max_records - n))
            parts.append(slow.table)
        return RecordBatch(pa.concat_tables(parts) if parts else RecordBatch.of([]).table)

    def _next_block(self) -> pa.Table | None:
        """The next block of records at or after the seek positions (in RECORD_SCHEMA), or
        None at the end or when the rest of the file needs the per-line reader."""
        from connector.batch import RECORD_SCHEMA, at_or_after

        try:
            if self._reader is None:
                self._reader = pj.open_json(
                    self.path,
                    read_options=pj.ReadOptions(block_size=_BLOCK),
                    parse_options=pj.ParseOptions(
                        explicit_schema=pa.unify_schemas([_PLAIN, _OTHER]), unexpected_field_behavior="ignore"
                    ),
                )
            raw = self._reader.read_next_batch()
        except StopIteration:
            self._mode = "done"
            return None
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            self._mode = "lines"
            return None
        topic = raw.column("topic")
        partition, offset, ts = raw.column("partition"), raw.column("offset"), raw.column("ts")
        if (
            any(raw.column(f.name).null_count < raw.num_rows for f in _OTHER)
            or partition.null_count
            or offset.null_count
            or pc.any(pc.equal(topic, "")).as_py()
            or (topic.null_count and not self.default_topic)
            or pc.min(offset).as_py() < 0
            or pc.min(partition).as_py() < 0
            or pc.max(partition).as_py() > INT32_MAX
            or (ts.null_count < raw.num_rows and (pc.min(ts).as_py() < 0 or pc.max(ts).as_py() > _MAX_TS_MS))
        ):
            self._mode = "lines"
            return None
        topic = topic.fill_null(self.default_topic) if topic.null_count else topic
        now_ms = int(datetime.now(UTC).timestamp() * 1000)
        table = pa.Table.from_arrays(
            [
                topic,
                raw.column("partition").cast(pa.int32()),
                raw.column("offset").cast(pa.string()),
                raw.column("offset"),
                pc.multiply(raw.column("ts").fill_null(now_ms), 1000)
                .cast(pa.timestamp("us"))
                .cast(RECORD_SCHEMA.field("enqueued_time").type),
                raw.column("key").cast(pa.binary()),
                raw.column("payload").cast(pa.binary()),
                pa.nulls(raw.num_rows, pa.string()),
            ],
            schema=RECORD_SCHEMA,
        )
        self._parsed += raw.num_rows
        return table.filter(at_or_after(table, self._positions)) if self._positions else table


__all__ = ["FileSource", "parse_line"]

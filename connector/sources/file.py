"""Replay of a topic dump in kcat's `-J` JSON-lines envelope.

One JSON object per line: `topic`, `partition`, `offset`, `ts` (ms), `key`, `payload`
(null is a tombstone), `headers` (kcat's flat `[k, v, k, v]` list, or an object). Event
Hubs fields are used when present: `sequence_number`, `enqueued_time` (ISO text or ms),
`partition_key` (preferred over `key`), and `offset` as the Event Hubs offset text.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping

import orjson

from connector.errors import SourceError
from connector.records import SourceRecord
from connector.sources import Source


def _bytes(v: Any) -> bytes | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode()
    return orjson.dumps(v)  # kcat -s avro prints decoded objects


def _time(v: Any) -> datetime:
    if isinstance(v, (int, float)):
        return datetime.fromtimestamp(v / 1000, tz=timezone.utc)
    t = datetime.fromisoformat(str(v).replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _headers(v: Any) -> tuple[tuple[str, bytes | None], ...]:
    if not v:
        return ()
    if isinstance(v, dict):
        return tuple((str(k), _bytes(x)) for k, x in v.items())
    return tuple((str(v[i]), _bytes(v[i + 1])) for i in range(0, len(v) - 1, 2))


def parse_line(doc: Mapping[str, Any], default_topic: str | None = None) -> SourceRecord:
    topic = doc.get("topic") or default_topic
    if not topic:
        raise KeyError("topic")
    offset = doc["offset"] if "offset" in doc else doc["sequence_number"]
    seq = doc.get("sequence_number", offset)
    when = doc.get("enqueued_time", doc.get("ts"))
    return SourceRecord(
        topic=str(topic),
        partition=int(doc.get("partition", 0)),
        offset=str(offset),
        sequence_number=int(seq),
        enqueued_time=_time(when) if when is not None else datetime.now(timezone.utc),
        key=_bytes(doc.get("partition_key", doc.get("key"))),
        value=_bytes(doc.get("payload")),
        headers=_headers(doc.get("headers")),
    )


class FileSource(Source):
    """Reads the whole file once; records below the seek positions are skipped."""

    def __init__(self, path: str | Path, default_topic: str | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise SourceError(f"source.path: no such file {str(self.path)!r}; give a kcat -J dump (JSON lines)")
        self.default_topic = default_topic
        self._positions: dict[str, int] = {}
        self._lines: Iterator[SourceRecord] | None = None

    def seek(self, positions: Mapping[str, int]) -> None:
        self._positions = dict(positions)
        self._lines = None

    def _records(self) -> Iterator[SourceRecord]:
        with self.path.open("rb") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = parse_line(orjson.loads(line), self.default_topic)
                except (orjson.JSONDecodeError, KeyError, ValueError, TypeError) as e:
                    raise SourceError(
                        f"{self.path}:{n}: not a kcat -J record ({type(e).__name__}: {e}); "
                        "each line needs topic (or source.topic), partition, offset, payload"
                    ) from None
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


__all__ = ["FileSource", "parse_line"]

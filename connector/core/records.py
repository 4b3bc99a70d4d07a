"""Domain value types shared by sources, decoding, ingest and compaction.

They are values: nothing mutates them after construction. They are not `frozen` because
one is built per record on the ingest hot path and a frozen dataclass's `__init__` (one
`object.__setattr__` per field) measured about 5x slower to construct.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from connector.core.errors import DecodeError


@dataclass(slots=True)
class SourceRecord:
    """One record as a source delivered it, before any decoding.

    `sequence_number` is the per-partition monotonic position (the Kafka offset, or the
    Event Hubs sequence number); `offset` is the source's own offset text, kept unchanged.
    `value is None` is a tombstone.
    """

    topic: str
    partition: int
    offset: str
    sequence_number: int
    enqueued_time: datetime
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    stream: str = field(init=False, compare=False)  # `topic:partition`, the partition's identity
    nbytes: int = field(init=False, compare=False)  # key + value bytes, what quotas count

    def __post_init__(self) -> None:
        self.stream = stream_id(self.topic, self.partition)
        self.nbytes = len(self.key or b"") + len(self.value or b"")

    def where(self) -> str:
        return f"topic {self.topic!r} partition {self.partition} offset {self.offset}"


# A header a source sets on a record it could not read: the value is why, and the record is
# a dead letter (reason `source`) with the raw bytes it had.
SOURCE_ERROR_HEADER = "cdclake.source-error"


def stream_id(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


@dataclass(slots=True)
class ChangeEvent:
    """A decoded Debezium change for one key of one table.

    `op` is one of c, u, d, r, t (a null-value tombstone decodes to `d` with `tombstone`
    set). `position` is the comparable source position (see `connector.core.ordering`), or None
    when the event carries none. `after` holds the after-image with values normalised to
    JSON scalars that Spark can cast to `after_types` (Spark SQL type names).
    """

    record: SourceRecord
    table: str
    key: str | None
    op: str
    snapshot: bool = False
    tombstone: bool = False
    position: tuple[int, ...] | None = None
    source_ts_ms: int | None = None
    after: dict[str, Any] | None = None
    after_types: dict[str, str] = field(default_factory=dict)

    @property
    def is_delete(self) -> bool:
        return self.op == "d"


@dataclass(slots=True)
class DeadLetter:
    """A record that could not be accepted, with the reason and the raw bytes."""

    record: SourceRecord
    table: str
    reason: str
    detail: str


_TABLE_CHARS = re.compile(r"[^a-z0-9_]+")
MAX_TABLE_NAME_LENGTH = 100  # default of `limits.max_table_name_length` (its files' directory names carry it)


def table_name(text: str, max_length: int = MAX_TABLE_NAME_LENGTH) -> str:
    """A Debezium table or topic segment as an Iceberg table name."""
    name = _TABLE_CHARS.sub("_", text.lower()).strip("_")
    if not name:
        raise DecodeError("route", f"cannot derive a table name from {text!r}")
    if len(name) > max_length:
        raise DecodeError(
            "route",
            f"table name {name[:40]!r}... has {len(name)} characters, over the limit of "
            f"{max_length} (limits.max_table_name_length)",
        )
    return name


def topic_table(topic: str, max_length: int = MAX_TABLE_NAME_LENGTH) -> str:
    """Debezium names topics `<prefix>.<schema>.<table>`: the last segment is the table."""
    return table_name(topic.rsplit(".", 1)[-1], max_length)

"""Table names and layouts.

For a source table `<t>` in namespace `<ns>`:

- `<ns>.<t>__log`: every accepted event (append-only), source positions in snapshot summaries;
- `<ns>.<t>__dead_letters`: what could not be accepted, raw bytes, position and reason;
- `<ns>.<t>`: latest state, one row per live key (metadata columns + flattened after-image);
- `<ns>.<t>__tombstones`: deleted keys with the deleting event's position and `expires_at`;
- `<ns>.<t>__stale`: the events compaction ignored as stale, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyiceberg.table import Table

LOG_SUFFIX = "__log"
DEAD_LETTERS_SUFFIX = "__dead_letters"
TOMBSTONES_SUFFIX = "__tombstones"
STALE_SUFFIX = "__stale"

UTC_TS = pa.timestamp("us", tz="UTC")
# Headers as Kafka (and Spark's Kafka source) give them: repeated names and binary values kept.
HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def _req(name: str, t: pa.DataType) -> pa.Field:
    return pa.field(name, t, nullable=False)


LOG_SCHEMA = pa.schema(
    [
        _req("topic", pa.string()),
        _req("partition", pa.int32()),
        _req("offset", pa.string()),
        _req("sequence_number", pa.int64()),
        _req("enqueued_time", UTC_TS),
        pa.field("key", pa.string()),
        _req("op", pa.string()),
        _req("snapshot", pa.bool_()),
        _req("tombstone", pa.bool_()),
        pa.field("source_position", pa.list_(pa.int64())),
        pa.field("source_ts_ms", pa.int64()),
        pa.field("after", pa.string()),
        pa.field("after_types", pa.string()),
        pa.field("value", pa.binary()),
        _req("payload_bytes", pa.int64()),
        pa.field("headers", HEADERS_TYPE),
        _req("ingested_at", UTC_TS),
    ]
)

DEAD_LETTER_SCHEMA = pa.schema(
    [
        _req("topic", pa.string()),
        _req("partition", pa.int32()),
        _req("offset", pa.string()),
        _req("sequence_number", pa.int64()),
        _req("enqueued_time", UTC_TS),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
        _req("reason", pa.string()),
        _req("detail", pa.string()),
        _req("ingested_at", UTC_TS),
    ]
)

POSITION_TEXT = "_source_position_text"
# Metadata columns of the state and tombstone tables (Spark DDL). `_key` is the
# compaction key; the ordering fields of the winning event are kept so a later (or late)
# event can be compared with what is held.
META_COLUMNS = [
    ("_key", "string NOT NULL"),
    ("_topic", "string"),
    ("_partition_id", "int"),
    ("_offset", "string"),
    ("_sequence_number", "bigint"),
    ("_enqueued_time", "timestamp"),
    ("_op", "string"),
    ("_snapshot", "boolean"),
    ("_source_ts", "bigint"),
    ("_source_position", "array<bigint>"),
    # the same position as text, its elements joined by commas: a round looks up the rows its
    # keys hold reading this instead of the list (a scan of scalar columns only is vectorized)
    (POSITION_TEXT, "string"),
    ("_payload_bytes", "bigint"),
]


def has_position_text(table: Table) -> bool:
    """Whether a state or tombstone table has `POSITION_TEXT` (a table made before it has not)."""
    return any(f.name == POSITION_TEXT for f in table.schema().fields)


def meta_names(text: bool) -> list[str]:
    """The names of `META_COLUMNS`, of a table with `POSITION_TEXT` (`text`) or without."""
    return [n for n, _ in META_COLUMNS if text or n != POSITION_TEXT]


TOMBSTONE_EXTRA = [("deleted_at", "timestamp"), ("expires_at", "timestamp")]
# A stale event: who it is, where it was in the log, and why it was ignored
# (docs/semantics.md, Stale events).
STALE_COLUMNS = [
    ("_key", "string"),
    ("_topic", "string"),
    ("_partition_id", "int"),
    ("_offset", "string"),
    ("_sequence_number", "bigint"),
    ("_enqueued_time", "timestamp"),
    ("_op", "string"),
    ("_snapshot", "boolean"),
    ("_source_position", "array<bigint>"),
    ("reason", "string"),
    ("compacted_at", "timestamp"),
]


@dataclass(frozen=True)
class TableNames:
    """Fully qualified names of the four tables that hold one source table."""

    catalog: str
    namespace: str
    table: str

    @property
    def state(self) -> str:
        return f"{self.namespace}.{self.table}"

    @property
    def log(self) -> str:
        return self.state + LOG_SUFFIX

    @property
    def dead_letters(self) -> str:
        return self.state + DEAD_LETTERS_SUFFIX

    @property
    def tombstones(self) -> str:
        return self.state + TOMBSTONES_SUFFIX

    @property
    def stale(self) -> str:
        return self.state + STALE_SUFFIX

    def spark(self, name: str) -> str:
        """The name as Spark SQL sees it (catalog-qualified, quoted)."""
        return ".".join(f"`{p}`" for p in (self.catalog, *name.split(".")))


def source_tables(table_names: list[str]) -> list[str]:
    """The source tables behind the catalog's table names (those that have a log)."""
    return sorted(n[: -len(LOG_SUFFIX)] for n in table_names if n.endswith(LOG_SUFFIX))

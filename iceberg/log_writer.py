"""Appends to the log and dead-letter tables, with source positions in the same commit.

The snapshot summary key `cdclake.positions` holds, as JSON, the next sequence number to
read per stream (`topic:partition`) for everything this table has accounted for. It is
written in the commit that adds the rows, and recovered by walking the snapshot ancestry
(maintenance commits in between carry no positions and are skipped).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import pyarrow as pa
from pyiceberg.table import Table
from pyiceberg.types import StringType

from connector.core.faults import crash_point

log = logging.getLogger(__name__)

POSITIONS_PROPERTY = "cdclake.positions"
WRITER_PROPERTY = "cdclake.writer"  # which process made the commit (host and pid)


def summary_value(table: Table, key: str, with_key: str | None = None, snapshot_id: int | None = None) -> str | None:
    """The value of `key` in the newest snapshot of the current ancestry (of `snapshot_id`'s)
    that has it (or that has `with_key`: `key` of the newest snapshot that recorded
    positions, say)."""
    snapshot = table.current_snapshot() if snapshot_id is None else table.snapshot_by_id(snapshot_id)
    while snapshot is not None:
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if (with_key or key) in props:
            return props.get(key)
        if snapshot.parent_snapshot_id is None:
            return None
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id)
    return None


def committed_positions(table: Table) -> dict[str, int]:
    raw = summary_value(table, POSITIONS_PROPERTY)
    return {k: int(v) for k, v in json.loads(raw).items()} if raw else {}


def summary_properties(positions: Mapping[str, int]) -> dict[str, str]:
    """The snapshot summary entries that record `positions`."""
    return {POSITIONS_PROPERTY: json.dumps(dict(sorted(positions.items())), separators=(",", ":"))}


def append_with_positions(
    table: Table,
    rows: pa.Table,
    positions: Mapping[str, int] | None,
    props: Mapping[str, str] | None = None,
    crash_tag: str = "ingest",
    branch: str = "main",
) -> None:
    """Append `rows` (possibly none) and record `positions` (None: leave them as they are) in
    the same snapshot of `branch`. pyiceberg retries a commit that met another on top of it."""
    props = {**(summary_properties(positions) if positions is not None else {}), **(props or {})}
    with table.transaction() as tx:
        tx.append(rows.cast(table.schema().as_arrow()), snapshot_properties=props, branch=branch)
        crash_point(f"{crash_tag}.before-commit")  # data files written, nothing committed
    crash_point(f"{crash_tag}.after-commit")


def upgrade(table: Table, layout: pa.Schema) -> Table:
    """A table written by an older layout, brought to `layout` without changing a row: the
    headers once stored as JSON text stay in `headers_json`, and new columns are added
    (null in the rows before them)."""
    headers = table.schema().find_field("headers") if "headers" in table.schema().column_names else None
    if headers is not None and isinstance(headers.field_type, StringType):
        with table.update_schema() as update:
            update.rename_column("headers", "headers_json")
        log.info(
            "table %s: headers are kept as Kafka gives them from now on; the earlier text is in headers_json",
            table.name(),
        )
    if set(layout.names) - set(table.schema().column_names):
        with table.update_schema() as update:
            update.union_by_name(layout)
    return table

"""Appends to the log and dead-letter tables, with source positions in the same commit.

Rows are written as Parquet data files where they are (on Spark's executors, by a
`DataFileWriter` with a `FileTarget` shipped from the driver) and committed by the driver
(`commit_data_files`): no row crosses back to the JVM or to the driver.

The snapshot summary key `summary_keys.POSITIONS` holds the next sequence number to read per
stream (`topic:partition`) for everything this table has accounted for. It is written in the
commit that adds the rows, and recovered by walking the snapshot ancestry (maintenance commits
in between carry no positions and are skipped).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.types import StringType

from connector.core.faults import crash_point
from iceberg import compat
from iceberg.summary_keys import POSITIONS

log = logging.getLogger(__name__)


def committed_positions(table: Table) -> dict[str, int]:
    return POSITIONS.read(table) or {}


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
    props = {**(POSITIONS.entry(dict(positions)) if positions is not None else {}), **(props or {})}
    with table.transaction() as tx:
        tx.append(rows.cast(table.schema().as_arrow()), snapshot_properties=props, branch=branch)
        crash_point(f"{crash_tag}.before-commit")  # data files written, nothing committed
    crash_point(f"{crash_tag}.after-commit")


@dataclass(frozen=True)
class FileTarget:
    """What a Spark task needs to write data files of a table: its metadata (schema with field
    ids, location, write properties) and its FileIO (picklable, so shipped from the driver)."""

    metadata: TableMetadata
    io: FileIO

    @classmethod
    def of(cls, table: Table) -> FileTarget:
        return cls(table.metadata, table.io)

    @classmethod
    def new(cls, io: FileIO, location: str, layout: pa.Schema) -> FileTarget:
        """A table not created yet: `layout` with the field ids a new table gets, at `location`
        (the creator checks the table it made has both)."""
        return cls(compat.new_table_metadata(layout, location), io)

    def fits(self, table: Table) -> bool:
        """Files written for this target can be committed to `table`."""
        return self.metadata.location == table.location() and self.metadata.schema() == table.schema()


class DataFileWriter:
    """One Parquet data file of a target table, written batch by batch where the task runs
    (a row group per `write`); `close` gives its description (`compat.encode_data_files`)
    for `commit_data_files`. Nothing is committed: a file no commit names is an orphan.

    Rows are cast to the table's schema here: pyiceberg's own projection
    (`_to_requested_schema`) writes a null list as an empty one."""

    def __init__(self, target: FileTarget):
        self.target = target
        self.arrow = target.metadata.schema().as_arrow()
        self._file: compat.ParquetDataFile | None = None

    def write(self, rows: pa.Table) -> None:
        """Append `rows` (a layout's columns: an older table's extra columns are left null)."""
        if not rows.num_rows:
            return
        n = rows.num_rows
        rows = pa.table(
            {f.name: rows[f.name] if f.name in rows.column_names else pa.nulls(n, f.type) for f in self.arrow}
        )
        if self._file is None:
            self._file = compat.ParquetDataFile(self.target.metadata, self.target.io)
        self._file.write(rows.cast(self.arrow))

    def close(self) -> bytes:
        return compat.encode_data_files([self._file.close()] if self._file is not None else [])


def commit_data_files(table: Table, written: Iterable[bytes], props: Mapping[str, str], branch: str) -> None:
    """One snapshot of `branch` that adds the data files `DataFileWriter`s described, with
    `props` in its summary."""
    with table.transaction() as tx:
        compat.append_data_files(tx, written, props, branch)
        crash_point("ingest.before-commit")  # data files written, nothing committed


def delete_data_files(io: FileIO, written: Iterable[bytes]) -> None:
    """Remove data files that no commit will name (best effort: orphan-file removal catches
    what is left)."""
    for blob in written:
        for path in compat.data_file_paths(blob):
            try:
                io.delete(path)
            except Exception as e:  # noqa: BLE001 - cleanup only
                log.debug("could not remove %s: %s", path, e)


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

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
import pickle
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.io.fileformat import FileFormatFactory
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record
from pyiceberg.types import StringType

from connector.core.faults import crash_point
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
        from pyiceberg.catalog import Catalog
        from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
        from pyiceberg.table.metadata import new_table_metadata
        from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

        schema = Catalog._convert_schema_if_needed(layout)
        return cls(new_table_metadata(schema, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, location, {}), io)

    def fits(self, table: Table) -> bool:
        """Files written for this target can be committed to `table`."""
        return self.metadata.location == table.location() and self.metadata.schema() == table.schema()


class DataFileWriter:
    """One Parquet data file of a target table, written batch by batch where the task runs
    (a row group per `write`); `close` gives its description, pickled, for
    `commit_data_files`. Nothing is committed: a file no commit names is an orphan.

    Rows are cast to the table's schema here: pyiceberg's own projection
    (`_to_requested_schema`) writes a null list as an empty one."""

    def __init__(self, target: FileTarget):
        self.target = target
        self.arrow = schema_to_pyarrow(target.metadata.schema(), include_field_ids=True)
        self._writer: Any = None

    def write(self, rows: pa.Table) -> None:
        """Append `rows` (a layout's columns: an older table's extra columns are left null)."""
        if not rows.num_rows:
            return
        n = rows.num_rows
        rows = pa.table(
            {f.name: rows[f.name] if f.name in rows.column_names else pa.nulls(n, f.type) for f in self.arrow}
        )
        if self._writer is None:
            meta, fmt = self.target.metadata, FileFormatFactory.get(FileFormat.PARQUET)
            self.path = load_location_provider(meta.location, meta.properties).new_data_location(
                f"00000-0-{uuid.uuid4()}.{fmt.file_extension()}"
            )
            self._out = self.target.io.new_output(self.path)
            self._writer = fmt.create_writer(self._out, meta.schema(), meta.properties)
        self._writer.write(rows.cast(self.arrow))

    def close(self) -> bytes:
        if self._writer is None:
            return pickle.dumps([])
        stats = self._writer.close()
        meta = self.target.metadata
        data_file = DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=self.path,
            file_format=FileFormat.PARQUET,
            partition=Record(),
            file_size_in_bytes=len(self._out),
            sort_order_id=None,
            spec_id=meta.default_spec_id,
            equality_ids=None,
            key_metadata=None,
            **stats.to_serialized_dict(),
        )
        return pickle.dumps([data_file])


def commit_data_files(table: Table, written: Iterable[bytes], props: Mapping[str, str], branch: str) -> None:
    """One snapshot of `branch` that adds the data files `DataFileWriter`s described, with
    `props` in its summary."""
    with table.transaction() as tx:
        with tx.update_snapshot(snapshot_properties=dict(props), branch=branch).fast_append() as append:
            for blob in written:
                for f in pickle.loads(blob):
                    append.append_data_file(f)
        crash_point("ingest.before-commit")  # data files written, nothing committed


def delete_data_files(io: FileIO, written: Iterable[bytes]) -> None:
    """Remove data files that no commit will name (best effort: orphan-file removal catches
    what is left)."""
    for blob in written:
        for f in pickle.loads(blob):
            try:
                io.delete(f.file_path)
            except Exception as e:  # noqa: BLE001 - cleanup only
                log.debug("could not remove %s: %s", f.file_path, e)


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

"""Every use of what pyiceberg does not offer as public API, in one place (PySpark's and
py4j's: `iceberg.compat_spark`).

tests/iceberg/test_compat.py holds a contract test per internal used here, run on the
installed versions (`CHECKED_AGAINST`): an upgrade that changes or removes one fails there,
naming it. The rest of the project uses the libraries' public API only (tests/test_layers.py
checks the source for their private names).

What a Spark task tells the driver about the data files it wrote crosses processes as this
module's own JSON (`encode_data_files`), not as pickled pyiceberg objects, so the two ends
agree on it whatever pyiceberg's classes hold.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from cachetools import LRUCache
from pyiceberg.io import FileIO
from pyiceberg.io.fileformat import FileFormatFactory
from pyiceberg.io.pyarrow import ArrowScan  # importing it registers the Parquet writer too
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestListWriter,
)
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.metadata import TableMetadata, TableMetadataV1, TableMetadataV2, TableMetadataV3
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import Record

if TYPE_CHECKING:
    from pyiceberg.table import DataScan, FileScanTask, Table, Transaction

# The versions the contract tests last passed on; an upgrade fails them until rechecked.
CHECKED_AGAINST = {"pyiceberg": "0.12.0", "pyspark": "4.1.3", "py4j": "0.10.9.9"}


# -- pyiceberg: a new table's metadata, before the table exists


def new_table_metadata(layout: pa.Schema, location: str) -> TableMetadata:
    """The metadata pyiceberg's `create_table(schema=layout, location=location)` gives a new
    unpartitioned table (the same field ids), made where no catalog is (a Spark task).
    pyiceberg converts an Arrow schema only inside its catalog (`_convert_schema_if_needed`)."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
    from pyiceberg.table.metadata import new_table_metadata as new
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

    schema = Catalog._convert_schema_if_needed(layout)
    return new(schema, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, location, {})


# -- pyiceberg: data files written in a Spark task, committed by the driver

# What pyiceberg's Parquet writer reports of a file, each of which the encoding carries.
_STATS: tuple[str, ...] = ("record_count", "column_sizes", "value_counts", "null_value_counts", "nan_value_counts")
_STATS += ("lower_bounds", "upper_bounds", "split_offsets")


class ParquetDataFile:
    """One Parquet data file of an unpartitioned table, written batch by batch (a row group
    per `write`) by pyiceberg's file-format writer, which its documentation does not cover
    (`FileFormatFactory`, `create_writer`, the statistics' `to_serialized_dict`)."""

    def __init__(self, metadata: TableMetadata, io: FileIO):
        from pyiceberg.table.locations import load_location_provider

        fmt = FileFormatFactory.get(FileFormat.PARQUET)
        self.path = load_location_provider(metadata.location, metadata.properties).new_data_location(
            f"00000-0-{uuid.uuid4()}.{fmt.file_extension()}"
        )
        self.spec_id = metadata.default_spec_id
        self._out = io.new_output(self.path)
        self._writer = fmt.create_writer(self._out, metadata.schema(), metadata.properties)

    def write(self, rows: pa.Table) -> None:
        """`rows` in the table's Arrow schema."""
        self._writer.write(rows)

    def close(self) -> dict[str, Any]:
        """The file's description, as `encode_data_files` takes it."""
        stats = self._writer.close().to_serialized_dict()
        if set(stats) != set(_STATS):  # a field the driver would not get: stop rather than drop it
            raise RuntimeError(
                f"pyiceberg {version('pyiceberg')}: the Parquet writer's statistics now have {sorted(stats)}, "
                f"not {sorted(_STATS)}; update iceberg/compat.py"
            )
        return {
            "file_path": self.path,
            "file_size_in_bytes": len(self._out),
            "spec_id": self.spec_id,
            **{k: stats[k] for k in _STATS},
        }


def _keys(m: Mapping[int, Any], value: Callable[[Any], Any] = int) -> dict[str, Any]:
    return {str(k): value(v) for k, v in m.items()}


def encode_data_files(files: Sequence[Mapping[str, Any]]) -> bytes:
    """`ParquetDataFile.close` descriptions as JSON (field ids as keys, bounds in base64)."""
    out = []
    for f in files:
        out.append(
            {
                "file_path": f["file_path"],
                "file_size_in_bytes": f["file_size_in_bytes"],
                "spec_id": f["spec_id"],
                "record_count": f["record_count"],
                **{k: _keys(f[k]) for k in ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts")},
                **{k: _keys(f[k], lambda b: base64.b64encode(b).decode()) for k in ("lower_bounds", "upper_bounds")},
                "split_offsets": f["split_offsets"],
            }
        )
    return json.dumps(out).encode()


def decode_data_files(blob: bytes) -> list[DataFile]:
    """pyiceberg's `DataFile`s (`DataFile.from_args`, as pyiceberg's own writer builds them)
    of `encode_data_files`' output, for a fast append."""

    def ints(m: Mapping[str, int]) -> dict[int, int]:
        return {int(k): int(v) for k, v in m.items()}

    def bounds(m: Mapping[str, str]) -> dict[int, bytes]:
        return {int(k): base64.b64decode(v) for k, v in m.items()}

    return [
        DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=f["file_path"],
            file_format=FileFormat.PARQUET,
            partition=Record(),
            file_size_in_bytes=f["file_size_in_bytes"],
            sort_order_id=None,
            spec_id=f["spec_id"],
            equality_ids=None,
            key_metadata=None,
            record_count=f["record_count"],
            column_sizes=ints(f["column_sizes"]),
            value_counts=ints(f["value_counts"]),
            null_value_counts=ints(f["null_value_counts"]),
            nan_value_counts=ints(f["nan_value_counts"]),
            lower_bounds=bounds(f["lower_bounds"]),
            upper_bounds=bounds(f["upper_bounds"]),
            split_offsets=f["split_offsets"],
        )
        for f in json.loads(blob)
    ]


def append_data_files(tx: Transaction, written: Iterable[bytes], props: Mapping[str, str], branch: str) -> None:
    """Adds the files `encode_data_files` described to `tx` as one fast append to `branch`
    (pyiceberg's snapshot producer, which its documentation does not cover)."""
    with tx.update_snapshot(snapshot_properties=dict(props), branch=branch).fast_append() as append:
        for blob in written:
            for f in decode_data_files(blob):
                append.append_data_file(f)


def data_file_paths(blob: bytes) -> list[str]:
    """The paths of the files `encode_data_files` described."""
    return [f["file_path"] for f in json.loads(blob)]


# -- pyiceberg: reading some of a scan's files


def file_reader(scan: DataScan) -> Callable[[Sequence[FileScanTask]], pa.Table]:
    """Reads some of `scan`'s planned files (its filter and projection applied) into one table.
    pyiceberg's public `to_arrow` and `to_arrow_batch_reader` read every file of a scan at
    once; its `ArrowScan` reads the ones it is given."""
    return ArrowScan(scan.table_metadata, scan.io, scan.projection(), scan.row_filter, scan.case_sensitive).to_table


# -- pyiceberg: errors without a type of their own


def is_stale_snapshot(e: BaseException) -> bool:
    """pyiceberg's error for a snapshot built on metadata that another commit (of any branch)
    moved on: a plain ValueError naming the sequence number, with no type or code of its own."""
    return isinstance(e, ValueError) and "sequence number" in str(e)


class MetadataParsedOnce:
    """A mixin for pyiceberg's `SqlCatalog` (before it among the bases): a table loaded from a
    catalog row that names the metadata file it named at the table's last load, of the same
    size, takes that load's parse (`_PARSED`), through the step from the row to the table
    that `load_table` takes (`_convert_orm_to_iceberg`). A metadata file is never changed once
    written (each commit writes a new one and points the row at it); the parse is about half
    of a load (pydantic's validation of the JSON), and a round loads its tables many times.
    A commit through the catalog leaves the metadata it wrote as the parse of its file (each
    commit loads the table first). Tables come with metadata that is never copied (`shared`)."""

    def commit_table(self, table: Table, requirements: tuple[Any, ...], updates: tuple[Any, ...]) -> Any:
        from pyiceberg.catalog import Catalog
        from pyiceberg.io import load_file_io

        response = super().commit_table(table, requirements, updates)  # type: ignore[misc]
        catalog: Any = self
        identifier, location = table.name(), response.metadata_location
        key = (catalog.name, Catalog.namespace_to_string(Catalog.namespace_from(identifier)), identifier[-1])
        size = len(load_file_io(catalog.properties, location).new_input(location))
        _PARSED[key] = (location, size, shared(response.metadata))
        return response

    def _create_staged_table(self, *args: Any, **kwargs: Any) -> Any:
        """A table being created (`create_table_transaction`), with metadata never copied
        (`shared`): its transaction applies its changes again and deep-copies the result at every
        read of its metadata, about a dozen times in a creation."""
        staged = super()._create_staged_table(*args, **kwargs)  # type: ignore[misc]
        staged.metadata = shared(staged.metadata)
        return staged

    def _convert_orm_to_iceberg(self, orm_table: Any) -> Table:
        from pyiceberg.io import load_file_io
        from pyiceberg.serializers import FromInputFile

        location, namespace, name = orm_table.metadata_location, orm_table.table_namespace, orm_table.table_name
        if not (location and namespace and name):  # pyiceberg's own raises its error
            table: Table = super()._convert_orm_to_iceberg(orm_table)  # type: ignore[misc]
            return table
        catalog: Any = self
        file = load_file_io(catalog.properties, location).new_input(location)
        size = len(file)  # raises where the file is gone; one cut short or rewritten is parsed again
        key = (catalog.name, namespace, name)
        held = _PARSED.get(key)
        if held is None or held[:2] != (location, size):
            held = _PARSED[key] = (location, size, shared(FromInputFile.table_metadata(file)))
        metadata = held[2]
        return IcebergTable(
            identifier=catalog.identifier_to_tuple(namespace) + (name,),
            metadata=metadata,
            metadata_location=location,
            io=catalog._load_file_io(metadata.properties, location),
            catalog=catalog,
        )


class _Shared:
    """Table metadata that is never copied: pyiceberg's metadata is frozen (pydantic), and it
    changes metadata by new models (`model_copy(update=...)`), yet it deep-copies the whole
    metadata each time it applies a change (`update_table_metadata`). A commit did so about
    sixteen times, over every snapshot the table keeps for the snapshot retention: an ingest
    commit to a table of 1,800 snapshots (an hour of 2-second batches) took 1.3 s, and 17 ms
    without the copies (`python -m tests.bench.commits`). A copy of this metadata is itself."""

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Any:
        return self


class _SharedV1(_Shared, TableMetadataV1):
    pass


class _SharedV2(_Shared, TableMetadataV2):
    pass


class _SharedV3(_Shared, TableMetadataV3):
    pass


_SHARED: dict[int, type[TableMetadata]] = {1: _SharedV1, 2: _SharedV2, 3: _SharedV3}


def shared(metadata: TableMetadata) -> TableMetadata:
    """`metadata` (the same fields, not validated again) as metadata that is never copied
    (`_Shared`); the changes pyiceberg makes to it are too."""
    if isinstance(metadata, _Shared):
        return metadata
    return _SHARED[metadata.format_version].model_construct(_fields_set=metadata.model_fields_set, **dict(metadata))


# per table (catalog name, namespace, name): its metadata file at its last load, the file's size
# and its parse
_PARSED: dict[tuple[str, str, str], tuple[str, int, TableMetadata]] = {}


def without_retries(table: Table) -> Table:
    """`table` as it is, whose next commit pyiceberg does not retry: a conflict raises
    `CommitFailedException` at once instead of rebuilding the snapshot on top of the newer
    metadata. pyiceberg 0.12 takes the number of retries from `commit.retry.num-retries` of
    the metadata the table object holds; this copy holds 0 (nothing is committed by it)."""
    properties = {**table.metadata.properties, "commit.retry.num-retries": "0"}
    return IcebergTable(
        table.name(),
        shared(table.metadata).model_copy(update={"properties": properties}),
        table.metadata_location,
        table.io,
        table.catalog,
    )


# -- pyiceberg: a manifest's entries read once per process

# entries held at most (a data file's path, counts and column bounds: about 5 KiB for the
# log's 17 columns, so about 50 MB for tables of that width)
MANIFEST_ENTRIES_MAX = 10_000
_ENTRIES: LRUCache[tuple[str, int, int, int | None], list[ManifestEntry]] = LRUCache(MANIFEST_ENTRIES_MAX, len)
_ENTRIES_LOCK = threading.Lock()
_READ_ENTRIES = ManifestFile.fetch_manifest_entry


def _entries(self: ManifestFile, io: FileIO, discard_deleted: bool = True) -> list[ManifestEntry]:
    """`ManifestFile.fetch_manifest_entry`, the file read once: a manifest is never changed
    once written, so its entries are kept by its path and what they inherit from the
    manifest list; each call gets a list of its own."""
    key = (self.manifest_path, self.sequence_number, self.min_sequence_number, self.added_snapshot_id)
    with _ENTRIES_LOCK:
        held = _ENTRIES.get(key)
    if held is None:
        held = _READ_ENTRIES(self, io, discard_deleted=False)
        with _ENTRIES_LOCK:
            if len(held) <= MANIFEST_ENTRIES_MAX:
                _ENTRIES[key] = held
    return [e for e in held if not discard_deleted or e.status != ManifestEntryStatus.DELETED]


# manifests of the manifest lists held at most (a manifest list's manifests are a few hundred
# bytes each, and most of them are shared with the table's other lists)
MANIFEST_LISTS_MAX = 20_000
_LISTS: LRUCache[str, tuple[ManifestFile, ...]] = LRUCache(MANIFEST_LISTS_MAX, len)
_READ_LIST = Snapshot.manifests


def _list(self: Snapshot, io: FileIO) -> list[ManifestFile]:
    """`Snapshot.manifests`, the manifest list read once: a manifest list is never changed once
    written (each snapshot writes its own), so its manifests are kept by its path; each call
    gets a list of its own."""
    with _ENTRIES_LOCK:
        held = _LISTS.get(self.manifest_list)
    if held is None:
        held = tuple(_READ_LIST(self, io))
        with _ENTRIES_LOCK:
            if len(held) <= MANIFEST_LISTS_MAX:
                _LISTS[self.manifest_list] = held
    return list(held)


def _add_manifests(self: ManifestListWriter, manifest_files: list[ManifestFile]) -> ManifestListWriter:
    """`ManifestListWriter.add_manifests`, the manifests kept as written (with the sequence
    numbers the list gives them) by the list's path: the next commit to the table reads the
    list of the snapshot this one makes (a fast append keeps its manifests): py-spy found an
    ingest commit reading back the list it had just written in about 13% of its samples."""
    prepared = [self.prepare_manifest(m) for m in manifest_files]
    self._writer.write_block(prepared)
    with _ENTRIES_LOCK:
        if len(prepared) <= MANIFEST_LISTS_MAX:
            _LISTS[self._output_file.location] = tuple(prepared)
    return self


def read_manifests_once() -> None:
    """Every read of a manifest list and of a manifest's entries in this process (each scan's
    plan: a round's plan, its upkeep's checks) through `_list` and `_entries`, and each list
    this process writes held as written (`_add_manifests`); a small table's scan took
    3 - 4 ms, half of it reading its manifests."""
    ManifestFile.fetch_manifest_entry = _entries  # type: ignore[method-assign]
    Snapshot.manifests = _list  # type: ignore[method-assign]
    ManifestListWriter.add_manifests = _add_manifests  # type: ignore[method-assign]

"""Contract tests of `iceberg/compat.py`: each library internal it uses, on the installed
(pinned) versions. A failure names the internal and the version: an upgrade changed it, and
compat.py must follow (or move to a public API) before the upgrade goes in."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import GreaterThan
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.types import LongType

from connector.sinks import Sinks
from iceberg import compat
from iceberg.layouts import DEAD_LETTER_SCHEMA, LOG_SCHEMA
from iceberg.log_writer import commit_data_files


@contextmanager
def contract(internal: str, library: str) -> Iterator[None]:
    """Any failure inside, said as the internal that changed and the version that changed it."""
    try:
        yield
    except Exception as e:
        raise AssertionError(
            f"{internal} of {library} {version(library)} no longer does what iceberg/compat.py relies on "
            f"({type(e).__name__}: {e}); adapt compat.py (or use a public API) before upgrading"
        ) from e


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    catalog = SqlCatalog("compat", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("ns")
    return catalog


def file_fields(f) -> tuple:
    return (
        f.content,
        f.file_path,
        f.file_format,
        f.partition,
        f.record_count,
        f.file_size_in_bytes,
        f.column_sizes,
        f.value_counts,
        f.null_value_counts,
        f.nan_value_counts,
        f.lower_bounds,
        f.upper_bounds,
        f.split_offsets,
        f.sort_order_id,
        f.equality_ids,
        f.key_metadata,
    )


def test_the_libraries_are_the_versions_the_contracts_were_checked_on():
    for library, checked in compat.CHECKED_AGAINST.items():
        assert version(library) == checked, (
            f"{library} is {version(library)}, iceberg/compat.py was checked on {checked}: run "
            "tests/iceberg/test_compat.py (with -m spark) on it, then update compat.CHECKED_AGAINST"
        )


def test_a_new_tables_metadata_is_the_one_create_table_gives(catalog, tmp_path):
    with contract("Catalog._convert_schema_if_needed + table.metadata.new_table_metadata", "pyiceberg"):
        for name, layout in (("a__log", LOG_SCHEMA), ("a__dead_letters", DEAD_LETTER_SCHEMA)):
            location = (tmp_path / name).as_uri()
            made = compat.new_table_metadata(layout, location)
            table = catalog.create_table(("ns", name), schema=layout, location=location)
            assert made.schema() == table.schema()  # field ids included: what `FileTarget.fits` checks
            assert (made.location, made.default_spec_id, made.properties) == (
                table.location(),
                table.spec().spec_id,
                table.properties,
            )


def test_a_written_file_crosses_as_json_and_is_the_data_file_pyiceberg_reads_from_it(catalog):
    table = catalog.create_table(("ns", "t"), schema=pa.schema([("id", pa.int64()), ("s", pa.string())]))
    rows = pa.table({"id": [3, None, 1], "s": ["b", "a", None]}, schema=table.schema().as_arrow())
    with contract("io.fileformat FileFormatFactory / create_writer / to_serialized_dict", "pyiceberg"):
        out = compat.ParquetDataFile(table.metadata, table.io)
        out.write(rows.slice(0, 2))
        out.write(rows.slice(2))
        blob = compat.encode_data_files([out.close()])
    described = json.loads(blob)  # plain JSON: nothing of pyiceberg's classes crosses
    assert [f["record_count"] for f in described] == [3]
    assert compat.data_file_paths(blob) == [out.path]
    with contract("manifest.DataFile.from_args + the snapshot producer's fast_append", "pyiceberg"):
        (decoded,) = compat.decode_data_files(blob)
        # pyiceberg's own description of the file, read from its footer (what `add_files` does)
        assert file_fields(decoded) == file_fields(parquet_file_to_data_file(table.io, table.metadata, out.path))
        commit_data_files(table, [blob], {"k": "v"}, "main")
        table = catalog.load_table(("ns", "t"))
        (task,) = table.scan().plan_files()
        assert file_fields(task.file) == file_fields(decoded)
        assert table.scan().to_arrow().sort_by("s").to_pylist() == rows.sort_by("s").to_pylist()


def test_the_encoding_is_the_projects_own_and_decodes_as_written():
    low, high = (5).to_bytes(8, "little"), (9).to_bytes(8, "little")
    blob = json.dumps(
        [
            {
                "file_path": "file:///w/ns/t/data/f.parquet",
                "file_size_in_bytes": 100,
                "spec_id": 0,
                "record_count": 2,
                "column_sizes": {"1": 10},
                "value_counts": {"1": 2},
                "null_value_counts": {"1": 0},
                "nan_value_counts": {},
                "lower_bounds": {"1": base64.b64encode(low).decode()},
                "upper_bounds": {"1": base64.b64encode(high).decode()},
                "split_offsets": [4],
            }
        ]
    ).encode()
    with contract("manifest.DataFile.from_args", "pyiceberg"):
        (f,) = compat.decode_data_files(blob)
        assert (f.file_path, f.file_size_in_bytes, f.record_count, f.split_offsets) == (
            "file:///w/ns/t/data/f.parquet",
            100,
            2,
            [4],
        )
        counts = (f.column_sizes, f.value_counts, f.null_value_counts, f.nan_value_counts)
        assert counts == ({1: 10}, {1: 2}, {1: 0}, {})
        assert (f.lower_bounds, f.upper_bounds) == ({1: low}, {1: high})
    assert compat.encode_data_files([]) == b"[]" and compat.decode_data_files(b"[]") == []


def test_some_of_a_scans_files_are_read_with_its_filter_and_projection(catalog):
    table = catalog.create_table(("ns", "t"), schema=pa.schema([("id", pa.int64()), ("s", pa.string())]))
    for ids in ([1, 2], [3, 4], [5, 6]):
        table.append(pa.table({"id": ids, "s": [str(i) for i in ids]}, schema=table.schema().as_arrow()))
    scan = table.scan(row_filter=GreaterThan("id", 1), selected_fields=("id",))
    tasks = sorted(scan.plan_files(), key=lambda t: t.file.file_path)
    with contract("io.pyarrow.ArrowScan", "pyiceberg"):
        read = compat.file_reader(scan)
        some = [t for t in tasks if t.file.lower_bounds[1] != (3).to_bytes(8, "little", signed=True)]
        assert sorted(read(some)["id"].to_pylist()) == [2, 5, 6]
        assert read(tasks).column_names == ["id"]
        assert read(tasks).sort_by("id") == scan.to_arrow().sort_by("id")


def test_a_snapshot_on_moved_metadata_is_told_by_its_error_text(catalog):
    table = catalog.create_table(("ns", "t"), schema=pa.schema([("x", pa.int64())]))
    table.append(pa.table({"x": [1]}))
    table = catalog.load_table(("ns", "t"))
    table.manage_snapshots().create_branch(table.current_snapshot().snapshot_id, "run").commit()
    stale = catalog.load_table(("ns", "t"))
    catalog.load_table(("ns", "t")).append(pa.table({"x": [2]}))  # another commit moves `main`
    with contract("the ValueError of a snapshot on moved metadata (table.update)", "pyiceberg"):
        with pytest.raises(ValueError) as raised:
            stale.append(pa.table({"x": [3]}), branch="run")
        assert compat.is_stale_snapshot(raised.value), str(raised.value)
    assert not compat.is_stale_snapshot(ValueError("another problem"))


def test_a_commit_without_retries_fails_where_main_moved_and_pyiceberg_would_retry_it(catalog):
    from pyiceberg.exceptions import CommitFailedException

    table = catalog.create_table(("ns", "r"), schema=pa.schema([("x", pa.int64())]))
    table.append(pa.table({"x": [1]}))
    stale, retried = catalog.load_table(("ns", "r")), catalog.load_table(("ns", "r"))
    catalog.load_table(("ns", "r")).append(pa.table({"x": [2]}))  # another commit moves `main`
    with contract("commit.retry.num-retries of the held metadata, read by the client's retry", "pyiceberg"):
        with pytest.raises(CommitFailedException):
            compat.without_retries(stale).append(pa.table({"x": [3]}))
        retried.append(pa.table({"x": [4]}))  # pyiceberg's own: rebuilt on top of the newer `main`
    assert sorted(catalog.load_table(("ns", "r")).scan().to_arrow()["x"].to_pylist()) == [1, 2, 4]


class Parsing(compat.MetadataParsedOnce, SqlCatalog):
    """The project's SQL catalog mixin over pyiceberg's own."""


@pytest.fixture
def copies(monkeypatch) -> list[str]:
    """The deep copies of table metadata made from here on (the class of each)."""
    from pydantic import BaseModel
    from pyiceberg.table.metadata import TableMetadataCommonFields

    made: list[str] = []
    deepcopy = BaseModel.__deepcopy__

    def counted(self, memo=None):
        if isinstance(self, TableMetadataCommonFields):
            made.append(type(self).__name__)
        return deepcopy(self, memo)

    monkeypatch.setattr(BaseModel, "__deepcopy__", counted)
    return made


def test_shared_metadata_is_never_copied_and_commits_as_pyicebergs_own(catalog, copies):
    import copy

    for name in ("ours", "theirs"):
        catalog.create_table(("ns", name), schema=pa.schema([("x", pa.int64())])).append(pa.table({"x": [1]}))
    copies.clear()  # those of the set-up

    def commit(table) -> None:
        table.append(pa.table({"x": [2]}), snapshot_properties={"k": "v"})
        with table.update_schema() as update:
            update.add_column("y", LongType())
        table.transaction().set_properties(p="q").commit_transaction()

    with contract("metadata changed by new models (update_table_metadata's deep copy)", "pyiceberg"):
        commit(catalog.load_table(("ns", "theirs")))
        assert copies, "pyiceberg's own commits deep-copy the metadata"
        copies.clear()
        ours = compat.without_retries(Parsing("compat", **catalog.properties).load_table(("ns", "ours")))
        base = ours.metadata
        held = base.model_dump()
        assert copy.deepcopy(base) is base
        loaded = catalog.load_table(("ns", "ours")).metadata.model_dump()
        assert {**held, "properties": {}} == {**loaded, "properties": {}}
        commit(ours)
        assert copies == [] and base.model_dump() == held  # nothing copied, the base left as it was
    theirs, ours = catalog.load_table(("ns", "theirs")), catalog.load_table(("ns", "ours"))
    assert ours.schema() == theirs.schema() and ours.properties["p"] == theirs.properties["p"] == "q"
    assert ours.current_snapshot().summary["k"] == "v"
    assert ours.scan().to_arrow().to_pylist() == theirs.scan().to_arrow().to_pylist()


def test_a_table_created_in_a_transaction_has_metadata_never_copied_and_is_pyicebergs_own(catalog, copies):
    made = {}
    with contract("MetastoreCatalog._create_staged_table, CreateTableTransaction.commit_transaction", "pyiceberg"):
        for name, cat in (("theirs", catalog), ("ours", Parsing("compat", **catalog.properties))):
            copies.clear()
            tx = cat.create_table_transaction(("ns", name), LOG_SCHEMA)
            compat.append_data_files(tx, [], {"k": name}, "main")
            made[name] = (tx.commit_transaction(), list(copies))
        assert made["theirs"][1], "pyiceberg's own creation deep-copies the metadata"
        assert made["ours"][1] == []
    for name, (table, _) in made.items():
        loaded = catalog.load_table(("ns", name))
        assert table.metadata_location == loaded.metadata_location
        assert table.metadata.model_dump() == loaded.metadata.model_dump()
        assert table.current_snapshot().summary["k"] == name and loaded.scan().to_arrow().num_rows == 0
    theirs, ours = (catalog.load_table(("ns", n)) for n in ("theirs", "ours"))
    assert ours.schema() == theirs.schema() and ours.spec() == theirs.spec()


def test_a_table_loaded_again_takes_its_metadata_files_parse_and_is_the_table_pyiceberg_loads(
    catalog, tmp_path, monkeypatch
):
    from pyiceberg.serializers import FromInputFile

    parsing = Parsing("compat", **catalog.properties)
    parses = []
    parse = FromInputFile.table_metadata
    monkeypatch.setattr(FromInputFile, "table_metadata", staticmethod(lambda f: parses.append(f) or parse(f)))
    catalog.create_table(("ns", "m"), schema=pa.schema([("x", pa.int64())])).append(pa.table({"x": [1]}))
    with contract("SqlCatalog._convert_orm_to_iceberg and commit_table, Catalog._load_file_io", "pyiceberg"):
        for n in range(2):  # then a commit through `parsing`: the row names the file it wrote, not parsed
            parses.clear()
            tables = [parsing.load_table(("ns", "m")) for _ in range(3)]
            theirs = catalog.load_table(("ns", "m"))
            assert len(parses) == 2 - n, n  # one for the three loads (none after the commit), one for pyiceberg's own
            assert all(t.metadata is tables[0].metadata for t in tables)
            for t in tables:
                assert (t.name(), t.metadata.model_dump(), t.metadata_location, t.io.properties, type(t.io)) == (
                    theirs.name(),
                    theirs.metadata.model_dump(),
                    theirs.metadata_location,
                    theirs.io.properties,
                    type(theirs.io),
                )
            tables[-1].append(pa.table({"x": [2 + n]}))
    assert sorted(parsing.load_table(("ns", "m")).scan().to_arrow()["x"].to_pylist()) == [1, 2, 3]


def test_where_the_sinks_put_a_table_is_where_pyiceberg_puts_one_created_without_a_location(catalog, tmp_path):
    """Public API replaced `_resolve_table_location`; this is that the two still agree."""
    sinks = Sinks(catalog, "ns")
    assert sinks.location("a__log") == catalog.create_table(("ns", "a__log"), schema=LOG_SCHEMA).location()
    catalog.create_namespace("elsewhere", {"location": (tmp_path / "other").as_uri() + "/"})
    sinks = Sinks(catalog, "elsewhere")
    assert sinks.location("b__log") == catalog.create_table(("elsewhere", "b__log"), schema=LOG_SCHEMA).location()


def test_a_manifests_entries_are_read_once_and_are_the_ones_pyiceberg_reads(catalog, monkeypatch):
    """`compat.read_manifests_once`: each manifest's entries (added, existing, deleted, with
    what they inherit from the manifest list) are pyiceberg's own, read from the file once,
    and pyiceberg's scans read them through `ManifestFile.fetch_manifest_entry`."""
    from pyiceberg.manifest import ManifestFile

    own = compat._READ_ENTRIES  # pyiceberg's, whatever an earlier test installed
    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", own)
    monkeypatch.setattr(compat, "_ENTRIES", compat.LRUCache(compat.MANIFEST_ENTRIES_MAX, len))
    schema = pa.schema([pa.field("k", pa.string()), pa.field("v", pa.int64())])
    table = catalog.create_table("ns.entries", schema, properties={"commit.manifest.min-count-to-merge": "2"})
    for i in range(3):
        table.append(pa.table({"k": [f"k{i}", f"x{i}"], "v": [i, i]}, schema=schema))
    table.delete(GreaterThan("v", 1))  # a file removed: a deleted entry
    table = catalog.load_table("ns.entries")

    def entries(read, snapshot, discard):
        return sorted(
            (e.status, e.snapshot_id, e.sequence_number, e.file_sequence_number, file_fields(e.data_file))
            for m in snapshot.manifests(table.io)
            for e in read(m, table.io, discard_deleted=discard)
        )

    want = {(s.snapshot_id, d): entries(own, s, d) for s in table.snapshots() for d in (True, False)}
    assert any(e[0] == 2 for v in want.values() for e in v), "the history holds a deleted entry"  # DELETED = 2
    plan = sorted(t.file.file_path for t in table.scan(row_filter=GreaterThan("v", 0)).plan_files())
    with contract("ManifestFile.fetch_manifest_entry (what scans read entries through)", "pyiceberg"):
        compat.read_manifests_once()
        assert sorted(t.file.file_path for t in table.scan(row_filter=GreaterThan("v", 0)).plan_files()) == plan
        assert len(compat._ENTRIES) > 0, "a scan read its manifests through fetch_manifest_entry"
    for s in table.snapshots():
        for d in (True, False):
            assert entries(ManifestFile.fetch_manifest_entry, s, d) == want[(s.snapshot_id, d)]
    for m in table.current_snapshot().manifests(table.io):
        Path(m.manifest_path.removeprefix("file://")).unlink()  # read once: no longer needed
    assert (
        entries(ManifestFile.fetch_manifest_entry, table.current_snapshot(), True)
        == want[(table.current_snapshot().snapshot_id, True)]
    )


def test_a_manifest_list_is_read_once_and_gives_the_manifests_pyiceberg_reads(catalog, monkeypatch):
    """`compat.read_manifests_once`: each snapshot's manifests are pyiceberg's own, the list
    read from its file once, and pyiceberg's scans read them through `Snapshot.manifests`; a
    list this process writes is held as written, the manifests pyiceberg reads back from it."""
    from pyiceberg.manifest import ManifestListWriter
    from pyiceberg.table.snapshots import Snapshot

    own = compat._READ_LIST  # pyiceberg's, whatever an earlier test installed
    monkeypatch.setattr(Snapshot, "manifests", own)
    monkeypatch.setattr(ManifestListWriter, "add_manifests", ManifestListWriter.add_manifests)
    monkeypatch.setattr(compat, "_LISTS", compat.LRUCache(compat.MANIFEST_LISTS_MAX, len))
    schema = pa.schema([pa.field("k", pa.string()), pa.field("v", pa.int64())])
    table = catalog.create_table("ns.lists", schema)
    for i in range(3):
        table.append(pa.table({"k": [f"k{i}"], "v": [i]}, schema=schema))
    table = catalog.load_table("ns.lists")
    want = {s.snapshot_id: [m.manifest_path for m in own(s, table.io)] for s in table.snapshots()}
    assert [len(v) for v in want.values()] == [1, 2, 3]
    plan = sorted(t.file.file_path for t in table.scan(row_filter=GreaterThan("v", 0)).plan_files())
    with contract("Snapshot.manifests (what scans read manifest lists through)", "pyiceberg"):
        compat.read_manifests_once()
        assert sorted(t.file.file_path for t in table.scan(row_filter=GreaterThan("v", 0)).plan_files()) == plan
        assert table.current_snapshot().manifest_list in compat._LISTS, "a scan read its list through it"
    for s in table.snapshots():
        assert [m.manifest_path for m in s.manifests(table.io)] == want[s.snapshot_id]
        Path(s.manifest_list.removeprefix("file://")).unlink()  # read once: no longer needed
        assert [m.manifest_path for m in s.manifests(table.io)] == want[s.snapshot_id]
    with contract("ManifestListWriter.add_manifests (what a commit writes its manifest list through)", "pyiceberg"):
        table.append(pa.table({"k": ["k3"], "v": [3]}, schema=schema))
        written = table.current_snapshot()
        assert written.manifest_list in compat._LISTS, "the commit's list is held as it was written"
    read = own(written, table.io)  # from the file
    assert [m.sequence_number for m in read] == [4, 3, 2, 1]  # the new manifest's, given by the list
    assert written.manifests(table.io) == read  # every field of every manifest

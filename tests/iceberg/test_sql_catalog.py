"""The SQL catalog (`iceberg.catalog.Catalog`) on SQLite, the embedded default: what it adds
to pyiceberg's. No Spark."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pytest
from pyiceberg.exceptions import NoSuchTableError
from sqlalchemy import make_url

from iceberg.catalog import Loaded, TableUnreadableError, forget, load_catalog, reload
from iceberg.leases import acquire


def test_a_reader_in_an_open_transaction_does_not_hold_up_a_writer_of_the_sqlite_catalog(settings):
    """The SQLite catalog is in write-ahead-log mode: a lease taken (a write) while another
    connection reads in an open transaction goes through at once, where SQLite's default mode
    makes the writer wait for the reader (here up to the 5 s busy timeout, then `database is
    locked`); the reader keeps seeing the catalog as its transaction began."""
    catalog = load_catalog(settings)
    reader = sqlite3.connect(str(make_url(settings.catalog_uri).database), isolation_level=None)
    try:
        assert reader.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        acquire(catalog, "ns.before", "compaction").release()  # the leases' table made
        held = "SELECT count(*) FROM cdclake_leases WHERE table_name = 'ns.read-while-written'"
        reader.execute("BEGIN")
        assert reader.execute(held).fetchone()[0] == 0
        started = time.monotonic()
        lease = acquire(catalog, "ns.read-while-written", "compaction")
        assert time.monotonic() - started < 1
        assert reader.execute(held).fetchone()[0] == 0
        reader.execute("COMMIT")
        assert reader.execute(held).fetchone()[0] == 1
        lease.release()
    finally:
        reader.close()


def test_a_table_exists_where_the_catalog_has_its_row_without_its_metadata_read(settings):
    """`table_exists` asks the catalog's table only (pyiceberg's loads the table): a table
    whose metadata file is gone still exists, and loading it is the one-line error."""
    catalog = load_catalog(settings)
    name = f"{settings.catalog.namespace}.exists"
    assert not catalog.table_exists(name)
    table = catalog.create_table(name, pa.schema([("k", pa.string())]))
    assert catalog.table_exists(name) and catalog.table_exists((settings.catalog.namespace, "exists"))
    assert not catalog.table_exists(f"{settings.catalog.namespace}_other.exists")
    assert not catalog.table_exists(f"{settings.catalog.namespace}.exists2")
    Path(urlparse(table.metadata_location).path).unlink()
    assert catalog.table_exists(name)
    with pytest.raises(TableUnreadableError, match="its metadata file"):
        catalog.load_table(name)


def test_a_loaded_catalog_holds_each_table_as_first_loaded_until_a_write_reloads_it(settings):
    """`Loaded` (the upkeep's and the quiet check's catalog) loads a table once, absent ones
    included, and sees another commit only once `forget` or `reload` names the table."""
    catalog = load_catalog(settings)
    ns = settings.catalog.namespace
    rows = pa.table({"k": ["a"]})
    catalog.create_table(f"{ns}.held", rows.schema)
    view = Loaded(catalog)
    first = view.load_table(f"{ns}.held")
    assert view.load_table(f"{ns}.held") is first and first.current_snapshot() is None
    assert not view.table_exists(f"{ns}.later")
    catalog.load_table(f"{ns}.held").append(rows)  # a write past the view
    catalog.create_table(f"{ns}.later", rows.schema)
    assert view.load_table(f"{ns}.held").current_snapshot() is None
    assert not view.table_exists(f"{ns}.later")
    with pytest.raises(NoSuchTableError):
        view.load_table(f"{ns}.later")
    assert reload(view, f"{ns}.held").current_snapshot() is not None
    assert view.load_table(f"{ns}.held").current_snapshot() is not None
    forget(view, f"{ns}.later")
    assert view.table_exists(f"{ns}.later") and view.load_table(f"{ns}.later").name()[-1] == "later"

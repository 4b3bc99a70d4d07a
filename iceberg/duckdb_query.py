"""DuckDB over the lake's tables, without a JVM (`cdclake query --engine duckdb`).

Each table a query names as `<namespace>.<table>` becomes a DuckDB view over `iceberg_scan`
of the table's current metadata file: DuckDB's own Iceberg extension reads the data files
and applies the delete files. The extensions load from their pip packages (nothing is
downloaded). A warehouse on S3 is read through DuckDB's `httpfs` with the catalog's `s3.*`
properties, kept in a DuckDB secret (never printed).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import pyarrow as pa

from connector.core.errors import ConfigError, ConnectorError
from iceberg.azure import on_azure

if TYPE_CHECKING:
    import duckdb
    from pyiceberg.catalog import Catalog

    from connector.core.config import Settings

EXTENSIONS = ("avro", "iceberg")  # and httpfs for a warehouse on S3


class DuckDBQueryError(ConnectorError):
    """DuckDB refused the query (its own message, first line)."""


def connect(properties: dict[str, str], warehouse: str) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the Iceberg extension loaded and, for a warehouse on S3, a
    secret from the catalog's `s3.*` properties."""
    import duckdb

    if on_azure(warehouse):
        raise ConfigError(
            f"query --engine duckdb reads a warehouse on local disk or S3, not {warehouse.split('@')[0]}@...: "
            "use --engine spark"
        )
    s3 = warehouse.startswith(("s3://", "s3a://"))
    con = duckdb.connect()
    for name in EXTENSIONS + (("httpfs",) if s3 else ()):
        try:
            module = importlib.import_module(f"duckdb_extension_{name}")
        except ImportError:
            module = None
        where = Path(str(module.__file__)).parent if module else None
        found = sorted(where.glob(f"extensions/v{duckdb.__version__}/*.duckdb_extension")) if where else []
        if not found:
            raise ConfigError(
                f"the DuckDB extension {name} for duckdb {duckdb.__version__} is missing: "
                f"pip install duckdb-extension-{name}=={duckdb.__version__}"
            )
        con.load_extension(str(found[0]))
    if s3:
        con.execute(s3_secret(properties))
    return con


def s3_secret(properties: dict[str, str]) -> str:
    """DuckDB's `CREATE SECRET` for the S3 endpoint, keys and region the catalog uses."""
    options = {"TYPE": "s3"}
    endpoint = properties.get("s3.endpoint")
    if endpoint:
        url = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        options |= {"ENDPOINT": url.netloc, "USE_SSL": str(url.scheme == "https").lower(), "URL_STYLE": "path"}
    for key, option in (
        ("s3.access-key-id", "KEY_ID"),
        ("s3.secret-access-key", "SECRET"),
        ("s3.session-token", "SESSION_TOKEN"),
        ("s3.region", "REGION"),
    ):
        if properties.get(key):
            options[option] = properties[key]
    body = ", ".join(f"{k} {_value(k, v)}" for k, v in options.items())
    return f"CREATE SECRET cdclake_s3 ({body})"


def _value(option: str, value: str) -> str:
    return value if option in ("TYPE", "USE_SSL") else literal(value)


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def named_tables(sql: str, namespace: str, tables: list[str]) -> list[str]:
    """The tables of `tables` that `sql` names as `<namespace>.<table>` (either part may be in
    double quotes; names are matched as DuckDB does, ignoring case)."""
    part = r'(?:"((?:[^"]|"")+)"|([A-Za-z_][A-Za-z0-9_$]*))'
    named = set()
    for m in re.finditer(part + r"\s*\.\s*" + part, sql):
        ns, table = (m.group(1) or m.group(2)).replace('""', '"'), (m.group(3) or m.group(4)).replace('""', '"')
        if ns.lower() == namespace.lower():
            named.add(table.lower())
    return [t for t in tables if t.lower() in named]


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def query(catalog: Catalog, namespace: str, properties: dict[str, str], warehouse: str, sql: str) -> pa.Table:
    """`sql` on DuckDB over the tables of `namespace` it names (module docstring)."""
    import duckdb

    con = connect(properties, warehouse)
    try:
        tables = [t for _, t in catalog.list_tables(namespace)]
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {ident(namespace)}")
        for table in named_tables(sql, namespace, tables):
            location = catalog.load_table((namespace, table)).metadata_location
            con.execute(
                f"CREATE VIEW {ident(namespace)}.{ident(table)} AS SELECT * FROM iceberg_scan({literal(location)})"
            )
        return con.sql(sql).to_arrow_table()
    except duckdb.Error as e:
        raise DuckDBQueryError(f"query failed (duckdb): {str(e).strip().splitlines()[0]}") from None
    finally:
        con.close()


def run(settings: Settings, sql: str) -> pa.Table:
    """`query` on the settings' catalog and namespace."""
    from iceberg.catalog import load_catalog, storage_properties

    return query(
        load_catalog(settings), settings.catalog.namespace, storage_properties(settings), settings.warehouse, sql
    )

"""The one catalog shared by pyiceberg (`SqlCatalog`) and Spark (Iceberg `JdbcCatalog`).

Both read and write the same `iceberg_tables` rows in the same SQLite file, scoped by the
same catalog name, so a table either side writes is visible to the other.
"""

from __future__ import annotations

import tempfile
from typing import TYPE_CHECKING

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError

if TYPE_CHECKING:
    from connector.core.config import Settings


def load_catalog(settings: Settings) -> SqlCatalog:
    """The pyiceberg catalog, with the namespace created if missing.

    Raises ConfigError when the work directory cannot be written."""
    from connector.core.errors import ConfigError

    try:
        settings.root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=settings.root, prefix=".cdclake-write-test"):
            pass
    except OSError as e:
        raise ConfigError(
            f"work_dir {str(settings.root)!r} cannot be written ({e.strerror or e}): set work_dir "
            "(or CDCLAKE_WORK_DIR) to a writable directory"
        ) from None
    catalog = SqlCatalog(
        settings.catalog.name, uri=settings.catalog_uri, warehouse=settings.warehouse, **settings.catalog.properties
    )
    try:
        catalog.create_namespace(settings.catalog.namespace)
    except NamespaceAlreadyExistsError:
        pass
    return catalog


def jdbc_uri(sqlalchemy_uri: str) -> str:
    """`sqlite:////abs/path.db` (SQLAlchemy) -> `jdbc:sqlite:/abs/path.db` (sqlite-jdbc)."""
    prefix = "sqlite:///"
    if sqlalchemy_uri.startswith(prefix):
        return "jdbc:sqlite:" + sqlalchemy_uri[len(prefix) :]
    if sqlalchemy_uri.startswith("postgresql"):
        rest = sqlalchemy_uri.split("://", 1)[1].split("@")[-1]
        return "jdbc:postgresql://" + rest
    raise ValueError(f"catalog.uri {sqlalchemy_uri!r}: only sqlite and postgresql catalogs are supported")

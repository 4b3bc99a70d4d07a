"""The one catalog shared by pyiceberg (`SqlCatalog`) and Spark (Iceberg `JdbcCatalog`).

Both read and write the same `iceberg_tables` rows in the same SQLite file, scoped by the
same catalog name, so a table either side writes is visible to the other.
"""

from __future__ import annotations

import tempfile
from typing import TYPE_CHECKING

from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError
from sqlalchemy import select
from sqlalchemy.orm import Session

from connector.core.errors import ConnectorError

if TYPE_CHECKING:
    from connector.core.config import Settings


class TableUnreadableError(ConnectorError):
    """A table's current metadata file cannot be read (gone or damaged)."""


class Catalog(SqlCatalog):
    """pyiceberg's SQL catalog; a table whose metadata file cannot be read is one clear error."""

    def load_table(self, identifier):  # type: ignore[no-untyped-def]
        try:
            return super().load_table(identifier)
        except NoSuchTableError:
            raise
        except Exception as e:
            ns, name = self.identifier_to_database_and_table(identifier)
            with Session(self.engine) as session:
                row = session.execute(
                    select(IcebergTables.metadata_location, IcebergTables.previous_metadata_location).where(
                        IcebergTables.catalog_name == self.name,
                        IcebergTables.table_namespace == ns,
                        IcebergTables.table_name == name,
                    )
                ).first()
            if row is None:
                raise
            why = (str(e).splitlines() or [type(e).__name__])[0][:200]
            previous = f" (the previous one is {row[1]})" if row[1] else ""
            raise TableUnreadableError(
                f"table {ns}.{name}: its metadata file {row[0]} cannot be read ({type(e).__name__}: {why}); restore "
                f"the file from a backup, or register the table again at an earlier metadata file{previous} with "
                "Iceberg's register_table; other tables are not affected"
            ) from None


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
    catalog = Catalog(
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

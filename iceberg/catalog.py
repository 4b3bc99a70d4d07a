"""The one catalog shared by pyiceberg and Spark.

`type = "sql"`: pyiceberg's `SqlCatalog` and Iceberg's `JdbcCatalog` read and write the same
`iceberg_tables` rows in the same database (a SQLite file by default, PostgreSQL in
production), scoped by the same catalog name, so a table either side writes is visible to
the other. `type = "rest"`: pyiceberg's `RestCatalog` and Iceberg's `RESTCatalog` on the
same server.

The one-writer leases (`iceberg.leases`) are rows of a SQL database: the SQL catalog's own,
or for a REST catalog `catalog.leases_uri` (the catalog's `lease_engine`). A lease takes an
insert that fails on a held key and a renewal conditional on its holder, one statement
each on any SQL database; a REST catalog offers no such write (a table commit is
conditional, but each renewal would be a snapshot), and the stores' own (Azure Blob
leases, S3 conditional writes, a file on local disk) would be three to keep and test.
"""

from __future__ import annotations

import tempfile
from typing import TYPE_CHECKING, Any

from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import (
    ForbiddenError,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    OAuthError,
    UnauthorizedError,
)
from sqlalchemy import Engine, create_engine, make_url, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from connector.core.errors import ConnectorError
from iceberg import azure, compat

if TYPE_CHECKING:
    from connector.core.config import Settings


class TableUnreadableError(ConnectorError):
    """A table's current metadata file cannot be read (gone or damaged)."""


class Catalog(compat.MetadataParsedOnce, SqlCatalog):
    """pyiceberg's SQL catalog, each table metadata file parsed once (`compat.MetadataParsedOnce`);
    a table whose metadata file cannot be read is one clear error.
    A SQLite catalog is put in write-ahead-log mode (kept in the file): a writer (a commit,
    from Python or Spark's JVM, a lease's renewal) then neither waits for readers nor makes
    them wait."""

    def __init__(self, name: str, **properties: str):
        super().__init__(name, **properties)
        if self.engine.dialect.name == "sqlite":
            try:
                with self.engine.connect() as conn:
                    conn.exec_driver_sql("PRAGMA journal_mode=WAL")
            except OperationalError:  # another process holds the file: it sets the mode once free
                pass

    @property
    def lease_engine(self) -> Engine:
        return self.engine

    def table_exists(self, identifier: str | tuple[str, ...]) -> bool:
        """Whether the catalog has a row for the table (pyiceberg's loads and parses its metadata)."""
        namespace = self.namespace_to_string(self.namespace_from(identifier))
        with Session(self.engine) as session:
            row = session.execute(
                select(IcebergTables.table_name).where(
                    IcebergTables.catalog_name == self.name,
                    IcebergTables.table_namespace == namespace,
                    IcebergTables.table_name == self.table_name_from(identifier),
                )
            ).first()
        return row is not None

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


class Loaded:
    """A catalog whose tables are each loaded once, until a step that writes one reloads it
    (`reload`): the metadata of one moment, for decisions that look at a table several times."""

    def __init__(self, catalog: Any):
        self.catalog, self.tables = catalog, dict[str, Any]()  # None: the table does not exist

    def load_table(self, name: str) -> Any:
        if name not in self.tables:
            try:
                self.tables[name] = self.catalog.load_table(name)
            except NoSuchTableError:
                self.tables[name] = None
        if self.tables[name] is None:
            raise NoSuchTableError(f"Table does not exist: {name}")
        return self.tables[name]

    def table_exists(self, name: str) -> bool:
        if name not in self.tables and not self.catalog.table_exists(name):
            self.tables[name] = None
        return self.tables.get(name, True) is not None


def forget(catalog: Any, name: str) -> None:
    """After a write to table `name`: a `Loaded` catalog loads it again when next asked."""
    if isinstance(catalog, Loaded):
        catalog.tables.pop(name, None)


def reload(catalog: Any, name: str) -> Any:
    """Table `name` as the catalog has it now."""
    forget(catalog, name)
    return catalog.load_table(name)


class RestCatalogWithLeases(RestCatalog):
    """pyiceberg's REST catalog, with the database of the leases."""

    def __init__(self, name: str, lease_uri: str, **properties: str):
        super().__init__(name, **properties)
        self.lease_engine = create_engine(lease_uri)


def load_catalog(settings: Settings) -> Catalog | RestCatalogWithLeases:
    """The pyiceberg catalog, with the namespace created if missing (and each manifest's
    entries read once in this process: `compat.read_manifests_once`).

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
    compat.read_manifests_once()
    catalog: Catalog | RestCatalogWithLeases
    for attempt in (1, 2):
        try:
            if settings.catalog.type == "rest":
                catalog = RestCatalogWithLeases(
                    settings.catalog.name,
                    sqlalchemy_uri(settings, settings.leases_uri),
                    **rest_properties(settings),
                    warehouse=settings.warehouse,
                    **storage_properties(settings),
                )
            else:
                catalog = Catalog(
                    settings.catalog.name,
                    uri=sqlalchemy_uri(settings, settings.catalog_uri),
                    warehouse=settings.warehouse,
                    **storage_properties(settings),
                )
            break
        except OperationalError:  # two processes made a new catalog's tables at once: they are there now
            if attempt == 2:
                raise
        except (UnauthorizedError, ForbiddenError, OAuthError) as e:
            why = (str(e).splitlines() or [type(e).__name__])[0][:200]
            raise ConnectorError(
                f"the REST catalog at {settings.catalog.uri} refused the connector ({type(e).__name__}: {why}); "
                "set catalog.credential (client_id:secret) or catalog.token, with catalog.oauth2_server_uri "
                "where tokens come from another server"
            ) from None
        except OSError as e:  # a REST catalog that does not answer (requests' errors are OSErrors)
            why = (str(e).splitlines() or [type(e).__name__])[0][:200]
            raise ConnectorError(
                f"the REST catalog at {settings.catalog.uri} cannot be reached ({type(e).__name__}: {why}); "
                "check catalog.uri and that the server runs"
            ) from None
    try:
        catalog.create_namespace(settings.catalog.namespace)
    except NamespaceAlreadyExistsError:
        pass
    except IntegrityError:  # another process made it between pyiceberg's check and its insert
        if not catalog.namespace_exists(settings.catalog.namespace):
            raise
    return catalog


def storage_properties(settings: Settings, spark: bool = False) -> dict[str, str]:
    """The FileIO properties for pyiceberg (for Iceberg in Spark with `spark`): the configured
    ones, with timeouts for a warehouse on S3 (`timeout_seconds`) where none are set:
    pyiceberg's `s3.connect-timeout` / `s3.request-timeout`, S3FileIO's Apache HTTP client's;
    for a warehouse on Azure, the credentials of `catalog.azure` as each of them names them
    (`iceberg.azure`)."""
    props = dict(settings.catalog.properties)
    if azure.on_azure(settings.warehouse):
        given = azure.spark_properties if spark else azure.pyiceberg_properties
        props = {**given(settings.catalog, settings.warehouse), **props}
    if settings.warehouse.startswith(("s3://", "s3a://")):
        seconds = settings.catalog.timeout_seconds
        for key, value in (
            ("s3.connect-timeout", f"{seconds:g}"),
            ("s3.request-timeout", f"{seconds:g}"),
            ("http-client.apache.connection-timeout-ms", str(int(seconds * 1000))),
            ("http-client.apache.socket-timeout-ms", str(int(seconds * 1000))),
        ):
            props.setdefault(key, value)
    return props


def rest_properties(settings: Settings) -> dict[str, str]:
    """A REST catalog's `uri`, `credential`, `token` and `oauth2-server-uri` (for a credential
    without one: the catalog's own token endpoint), as pyiceberg's RestCatalog and Iceberg's
    RESTCatalog both name them (they hold secrets: never logged)."""
    c = settings.catalog
    props = {"uri": c.uri or ""}
    for key, secret in (("credential", c.credential), ("token", c.token)):
        if secret is not None:
            props[key] = secret.get_secret_value()
    if c.oauth2_server_uri or c.credential is not None:  # both clients' old default, named: it is deprecated
        props["oauth2-server-uri"] = c.oauth2_server_uri or f"{props['uri'].rstrip('/')}/v1/oauth/tokens"
    return props


def sqlalchemy_uri(settings: Settings, uri: str) -> str:
    """A SQLAlchemy URI (the catalog's, the leases') for pyiceberg, with the password and, for
    PostgreSQL, the connect and statement timeouts (never logged: it holds the password)."""
    url = make_url(uri)
    if url.get_backend_name() != "postgresql":
        return uri
    if settings.catalog.password is not None:
        url = url.set(password=settings.catalog.password.get_secret_value())
    seconds = settings.catalog.timeout_seconds
    query = {"connect_timeout": str(max(1, round(seconds))), "options": f"-c statement_timeout={int(seconds * 1000)}"}
    return url.update_query_dict({**query, **url.query}).render_as_string(hide_password=False)


def spark_catalog_properties(settings: Settings) -> dict[str, str]:
    """Iceberg's catalog properties in Spark for the same catalog: a `RESTCatalog` on the same
    server, else a `JdbcCatalog` on the same database (`jdbc_properties`)."""
    if settings.catalog.type == "rest":
        return {"type": "rest", **rest_properties(settings)}
    return {"type": "jdbc", **jdbc_properties(settings), "jdbc.schema-version": "V1"}


def jdbc_properties(settings: Settings) -> dict[str, str]:
    """Iceberg's `JdbcCatalog` properties for the same catalog: `uri` (`sqlite:////abs/path.db`
    -> `jdbc:sqlite:/abs/path.db`; `postgresql://user@host:port/db` ->
    `jdbc:postgresql://host:port/db` with `jdbc.user`, `jdbc.password` and the timeouts)."""
    url = make_url(settings.catalog_uri)
    backend = url.get_backend_name()
    if backend == "sqlite":
        return {"uri": "jdbc:sqlite:" + (url.database or "")}
    if backend != "postgresql":
        raise ValueError(f"catalog.uri {settings.catalog_uri!r}: only sqlite and postgresql catalogs are supported")
    seconds = str(max(1, round(settings.catalog.timeout_seconds)))
    return {
        "uri": f"jdbc:postgresql://{url.host or '127.0.0.1'}:{url.port or 5432}/{url.database or ''}",
        **({"jdbc.user": url.username} if url.username else {}),
        **({"jdbc.password": settings.catalog.password.get_secret_value()} if settings.catalog.password else {}),
        "jdbc.connectTimeout": seconds,
        "jdbc.socketTimeout": seconds,
    }

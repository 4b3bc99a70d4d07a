"""One configuration object, from a TOML file and `CDCLAKE_*` environment variables.

Environment variables override the file; nested keys use `__`, for example
`CDCLAKE_COMPACTION__TOMBSTONE_RETENTION_HOURS=48` or `CDCLAKE_SOURCE__PATH=dump.jsonl`.
Every error names the offending key.
"""

from __future__ import annotations

import contextvars
import os
import re
import tomllib
from collections.abc import Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource
from pydantic_settings.exceptions import SettingsError

from connector.core.errors import ConfigError
from connector.core.records import MAX_TABLE_NAME_LENGTH
from connector.core.source_config import FileSourceConfig, Section, SourceConfig

_CONFIG_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar("cdclake_config_file", default=None)


class AzureStorageConfig(Section):
    """How the job reaches a warehouse on Azure (`abfss://<container>@<account>.dfs.core.windows.net/<path>`):
    at most one of these; none, `DefaultAzureCredential` (a managed or workload identity, the
    `AZURE_*` variables of a service principal, `az login`)."""

    connection_string: SecretStr | None = Field(
        None,
        description="the storage account's connection string (CDCLAKE_CATALOG__AZURE__CONNECTION_STRING); "
        "its BlobEndpoint, where it has one, is the endpoint used",
    )
    account_key: SecretStr | None = Field(
        None, description="the storage account's key (CDCLAKE_CATALOG__AZURE__ACCOUNT_KEY)"
    )
    sas_token: SecretStr | None = Field(
        None, description="a SAS token for the container (CDCLAKE_CATALOG__AZURE__SAS_TOKEN)"
    )

    @model_validator(mode="after")
    def _one(self) -> AzureStorageConfig:
        given = [k for k in ("connection_string", "account_key", "sas_token") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of {', '.join(given)}, not {len(given)}")
        return self


class CatalogConfig(Section):
    name: str = Field("lake", description="catalog name, the same for pyiceberg and Spark")
    type: Literal["sql", "rest"] = Field(
        "sql",
        description="sql: one database that pyiceberg's SqlCatalog and Spark's JdbcCatalog share; rest: an "
        "Iceberg REST catalog (pyiceberg's RestCatalog, Spark's RESTCatalog)",
    )
    uri: str | None = Field(
        None,
        description="sql: the SQLAlchemy URI, sqlite:////abs/catalog.db (default <work_dir>/catalog.db) or "
        "postgresql+psycopg://user@host:port/db; rest: the catalog's http(s) URI",
    )
    password: SecretStr | None = Field(
        None, description="the PostgreSQL user's password, of the catalog or the leases (CDCLAKE_CATALOG__PASSWORD)"
    )
    credential: SecretStr | None = Field(
        None, description="rest: OAuth2 client credentials, client_id:client_secret (CDCLAKE_CATALOG__CREDENTIAL)"
    )
    token: SecretStr | None = Field(None, description="rest: a bearer token (CDCLAKE_CATALOG__TOKEN)")
    oauth2_server_uri: str | None = Field(None, description="rest: where tokens come from, if not the catalog")
    leases_uri: str | None = Field(
        None,
        description="rest: SQLAlchemy URI of the database holding the one-writer leases; default "
        "sqlite:////<work_dir>/leases.db (processes of one host); postgresql+psycopg://... for several hosts",
    )
    timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="catalog (PostgreSQL) and storage (S3) calls: connecting and each request give up after this",
    )

    @field_validator("uri", "leases_uri")
    @classmethod
    def _no_password(cls, uri: str | None) -> str | None:
        if uri is not None and re.match(r"^\w[\w+.-]*://[^/@]*:[^/@]*@", uri):
            raise ValueError("holds a password: give it in catalog.password (or CDCLAKE_CATALOG__PASSWORD) instead")
        return uri

    @model_validator(mode="after")
    def _known_scheme(self) -> CatalogConfig:
        sql = r"^(sqlite:///|postgresql(\+\w+)?://)"
        if self.type == "sql" and self.uri is not None and not re.match(sql, self.uri):
            raise ValueError(
                f"catalog.uri {self.uri!r}: give sqlite:////abs/path/catalog.db or "
                'postgresql+psycopg://user@host:port/db (or type = "rest" for a REST catalog)'
            )
        if self.type == "rest" and not re.match(r"^https?://", self.uri or ""):
            raise ValueError(
                f'catalog.type = "rest" needs catalog.uri = "https://..." (the REST catalog), not {self.uri!r}'
            )
        if self.leases_uri is not None and not re.match(sql, self.leases_uri):
            raise ValueError(
                f"catalog.leases_uri {self.leases_uri!r}: give sqlite:////abs/path/leases.db or postgresql+psycopg://..."
            )
        return self

    warehouse: str | None = Field(
        None, description="warehouse location: a path, s3://bucket/prefix, abfs://...; default <work_dir>/warehouse"
    )
    namespace: str = Field("cdc", description="namespace (database) of the connector's tables")
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="FileIO properties for pyiceberg and Spark's catalog alike (s3.endpoint, s3.access-key-id, ...)",
    )
    azure: AzureStorageConfig = AzureStorageConfig()

    @model_validator(mode="after")
    def _azure_warehouse(self) -> CatalogConfig:
        azure = re.match(r"^abfss?://", self.warehouse or "")
        if azure and not re.match(r"^abfss?://[^@/]+@[^@/.]+\.[^@/]+(/.*)?$", self.warehouse or ""):
            raise ValueError(
                f"warehouse {self.warehouse!r}: give abfss://<container>@<account>.dfs.core.windows.net/<path>"
            )
        if self.azure.model_fields_set and not (self.warehouse or "").startswith(("abfs://", "abfss://")):
            raise ValueError(
                "catalog.azure is for a warehouse on Azure: set catalog.warehouse to "
                "abfss://<container>@<account>.dfs.core.windows.net/<path>"
            )
        return self


class CompactionConfig(Section):
    ordering: Literal["source", "log"] = Field(
        "source",
        description="which change to a key is newest: source (the Debezium position, then the log position) "
        "or log (the highest offset, as Event Hubs and Kafka compaction); see docs/semantics.md",
    )
    min_cleanable_dirty_ratio: float = Field(
        0.5, ge=0.0, le=1.0, description="compact a partition once this share of its bytes is dirty (uncompacted)"
    )
    min_compaction_lag_seconds: float = Field(
        0.0, ge=0.0, description="events younger than this are not compacted yet (they stay readable in the log)"
    )
    max_compaction_lag_seconds: float | None = Field(
        None,
        gt=0.0,
        description="compact a partition whose oldest dirty event is this old, whatever its ratio; "
        "unset = never forced",
    )
    tombstone_retention_hours: float = Field(
        24.0, ge=0.0, description="a delete's tombstone stays readable (and guards its key) this long, then is purged"
    )
    log_retention_hours: float = Field(
        24.0,
        gt=0.0,
        description="the raw log keeps every event this long, and beyond it what a key still needs (checked "
        "against the tier's retention)",
    )
    between_batches: bool = Field(
        False,
        description="compact the tables a batch touched after every ingest batch / micro-batch "
        "(else compaction runs after ingest in `run`, or as its own `compact` job)",
    )
    parallel_tables: int = Field(
        4,
        gt=0,
        le=64,
        description="rounds of this many tables write at once in the one Spark application, each in a "
        "session of its own, after the small rounds' reads are shared (a table with nothing due costs no "
        "round: its commits' metadata says so)",
    )


class MaintenanceConfig(Section):
    enabled: bool = Field(True, description="after each compaction round, rewrite and expire what is due")
    snapshot_retention_hours: float = Field(
        1.0,
        ge=0.0,
        description="snapshots kept (time travel); older ones are expired with their files, never "
        "the newest one carrying the cleaner points or the ingest positions",
    )
    rewrite_files: int = Field(
        16,
        gt=0,
        description="rewrite a table's small files once it holds this many more "
        "data files than its bytes need (or a fifth of its rows, and at "
        "least 100,000, are deleted), the log's manifests once it has more than this",
    )
    orphan_age_hours: float = Field(
        24.0,
        ge=24.0,
        description="with each expiry, remove files no snapshot refers to that are older than this "
        "(what failed or killed writes left); must exceed the longest write, and Iceberg refuses less than 24",
    )


class LimitsConfig(Section):
    """What one event may hold (`connector.debezium.DecodeLimits`); over a limit: a dead letter."""

    max_depth: int = Field(64, gt=0, le=1000, description="nesting of an event's JSON value")
    max_columns: int = Field(1_000, gt=0, description="columns of an after-image")
    max_name_length: int = Field(128, gt=0, description="characters of a column name")
    max_table_name_length: int = Field(MAX_TABLE_NAME_LENGTH, gt=0, le=200, description="characters of a table name")
    max_value_bytes: int = Field(
        16 << 20, gt=0, description="bytes of a record's value (a dump's line), before it is parsed"
    )
    max_new_columns: int = Field(1_000, gt=0, description="columns one compaction round may add to a table")


class TableConfig(Section):
    """A table's settings. `[tables.<name>]` is a table's exact name or a glob
    (`[tables."inventory_*"]`); a table takes its exact entry, else the first glob in file
    order that matches it, else `[table_defaults]`; the keys an entry does not set come from
    `[table_defaults]`."""

    key_fields: list[str] = Field(default_factory=list, description="payload fields forming the key")
    tier: str | None = Field(None, description="Event Hubs tier of this table; default quotas.default_tier")
    compaction: bool = Field(True, description="false: the log only (required on the basic tier)")
    partitions: int | None = Field(None, gt=0, description="partitions of the event hub (checked against the tier)")
    log_retention_hours: float | None = Field(None, gt=0.0, description="override of compaction.log_retention_hours")
    max_event_bytes: int | None = Field(None, gt=0, description="override of the tier's event size limit")
    compacted_bytes_per_partition: int | None = Field(None, gt=0, description="override of the tier's quota")


class CustomTier(Section):
    compaction_supported: bool = Field(True, description="tables of this tier may be compacted")
    compacted_bytes_per_partition: int | None = Field(
        None, gt=0, description="what a partition may hold (state + tombstones + dirty log); unset = no limit"
    )
    max_event_bytes: int = Field(1024**2, gt=0, description="largest event; a larger one is a dead letter")
    max_partitions: int = Field(32, gt=0, description="partitions a table may receive from")
    max_retention_days: int = Field(7, gt=0, description="longest log retention")
    consumer_groups: int = Field(20, gt=0, description="consumer groups (for the Event Hubs template)")


class QuotaConfig(Section):
    default_tier: str = Field(
        "standard",
        description="Event Hubs tier of a table that names none: basic, standard, premium, dedicated, "
        "or one of quotas.custom",
    )
    policy: Literal["fail", "backpressure"] = Field(
        "fail", description="fail: stop with QuotaExceededError; backpressure: pause the partition, compact, resume"
    )
    soft_threshold: float = Field(0.8, gt=0.0, le=1.0, description="warn when usage reaches this share of the quota")
    custom: dict[str, CustomTier] = Field(default_factory=dict, description="extra tiers by name")


class SparkConfig(Section):
    master: str | None = Field(
        None,
        description="local[N], local[*], spark://host:port, k8s://https://host:port, yarn; unset: the one "
        "spark-submit was given, else local[*]",
    )
    driver_memory: str = Field("4g", description="JVM heap of the driver, e.g. 4g, 512m")
    shuffle_partitions: int = Field(8, gt=0, description="spark.sql.shuffle.partitions: about 4x the cores")
    jars_dir: str | None = Field(None, description="directory of Spark's JVM jars; default <repo>/.cache/jars")
    conf: dict[str, str] = Field(
        default_factory=dict,
        description='more Spark settings, e.g. {"spark.executor.memory" = "8g"}; they win, but for the '
        "driver's class path and `spark.jars` (after the project's jars) and its JVM options (they "
        "replace the product's, -XX:+UseParallelGC and, in a command that runs once, "
        "-XX:TieredStopAtLevel=1; with the class archive unless they name one)",
    )

    @field_validator("master")
    @classmethod
    def _master(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^(local(\[(\*|\d+)(,\d+)?\])?|spark://\S+|k8s://\S+|yarn)$", v):
            raise ValueError(
                f"{v!r} is not a Spark master: give local[2], local[*], spark://host:7077, "
                "k8s://https://host:443 or yarn"
            )
        return v

    @field_validator("driver_memory")
    @classmethod
    def _memory(cls, v: str) -> str:
        if not re.match(r"(?i)^\d+[kmgt]?$", v):
            raise ValueError(f"{v!r} is not a JVM memory size: give a number with k, m, g or t, e.g. 4g")
        return v


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CDCLAKE_", env_nested_delimiter="__", extra="forbid", frozen=True)

    work_dir: Path = Field(Path(".cdclake"), description="where the embedded default keeps catalog.db and warehouse/")
    catalog: CatalogConfig = CatalogConfig()
    source: SourceConfig = FileSourceConfig()
    compaction: CompactionConfig = CompactionConfig()
    maintenance: MaintenanceConfig = MaintenanceConfig()
    spark: SparkConfig = SparkConfig()
    quotas: QuotaConfig = QuotaConfig()
    limits: LimitsConfig = LimitsConfig()
    table_defaults: TableConfig = TableConfig()
    tables: dict[str, TableConfig] = Field(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = _CONFIG_FILE.get()
        toml = (TomlConfigSettingsSource(settings_cls, toml_file=path),) if path else ()
        return (init_settings, env_settings, *toml)

    @property
    def root(self) -> Path:
        return self.work_dir.resolve()

    @property
    def catalog_uri(self) -> str:
        return self.catalog.uri or f"sqlite:///{self.root / 'catalog.db'}"

    @property
    def leases_uri(self) -> str:
        """The database of the leases: the SQL catalog's, else `catalog.leases_uri`."""
        if self.catalog.type == "sql":
            return self.catalog_uri
        return self.catalog.leases_uri or f"sqlite:///{self.root / 'leases.db'}"

    @property
    def warehouse(self) -> str:
        return self.catalog.warehouse or (self.root / "warehouse").as_uri()

    def table_entry(self, table: str) -> str | None:
        """The `[tables.<entry>]` that applies to `table` (`table_entry`)."""
        return table_entry(self.tables, table)

    def table(self, table: str) -> TableConfig:
        """The settings of `table` (`table_settings`)."""
        return table_settings(self.tables, self.table_defaults, table)

    def table_key(self, table: str, key: str) -> str:
        """Where `table`'s `key` is set, for an error to name: `tables.<entry>.<key>` or
        `table_defaults.<key>`."""
        entry = self.table_entry(table)
        if entry is not None and key in self.tables[entry].model_fields_set:
            return f"tables.{entry}.{key}"
        return f"table_defaults.{key}"

    def named_tables(self) -> list[str]:
        """The tables named exactly in `[tables.<name>]` (not the globs)."""
        return [k for k in self.tables if not is_glob(k)]


def is_glob(name: str) -> bool:
    """A `[tables.<name>]` key is a glob when it holds a wildcard (a table name never does)."""
    return any(c in name for c in "*?[")


def table_entry(tables: Mapping[str, TableConfig], table: str) -> str | None:
    """The `[tables.<entry>]` that applies to `table`: its exact name, else the first glob
    (in file order) that matches it; None: `[table_defaults]` alone."""
    if table in tables:
        return table
    return next((k for k in tables if is_glob(k) and fnmatchcase(table, k)), None)


def table_settings(tables: Mapping[str, TableConfig], defaults: TableConfig, table: str) -> TableConfig:
    """The settings of `table`: its entry (`table_entry`) over `defaults`, key by key (an
    entry sets only the keys it names). Takes the table sections only (no secret), so Spark
    tasks can be given it."""
    entry = table_entry(tables, table)
    if entry is None:
        return defaults
    return TableConfig(**{**defaults.model_dump(exclude_unset=True), **tables[entry].model_dump(exclude_unset=True)})


# CDCLAKE_* variables that are not settings: the config file's path, test fault points
NOT_SETTINGS = frozenset({"CONFIG", "CRASH_AT", "FAIL_AT", "FUZZ_RECORDS"})


def _unknown_environment() -> list[str]:
    known = {name.upper() for name in Settings.model_fields}
    return sorted(
        k
        for k in os.environ
        if k.startswith("CDCLAKE_") and k[len("CDCLAKE_") :].split("__", 1)[0] not in known | NOT_SETTINGS
    )


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Settings from `path` (TOML), the environment and `overrides`, validated now.

    Raises ConfigError, one line naming the file, key or variable and what is wrong."""
    if path is not None and not Path(path).is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    unknown = _unknown_environment()
    if unknown:
        raise ConfigError(
            f"unknown environment variable {', '.join(unknown)}: settings are CDCLAKE_<SECTION>__<KEY> "
            f"with a section of {', '.join(sorted(Settings.model_fields))}"
        )
    token = _CONFIG_FILE.set(Path(path) if path else None)
    try:
        return Settings(**overrides)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        where = f" in {path}" if path else ""
        raise ConfigError(f"invalid configuration{where} (or CDCLAKE_* environment): {problems}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML in UTF-8: {e}") from None
    except SettingsError as e:  # a CDCLAKE_* value that should be JSON (a section, a list) is not
        raise ConfigError(
            f"invalid CDCLAKE_* environment variable: {e} (sections and lists are JSON, e.g. "
            'CDCLAKE_SOURCE__TOPICS=\'["a", "b"]\')'
        ) from None
    finally:
        _CONFIG_FILE.reset(token)

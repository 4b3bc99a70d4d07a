"""State-table columns: Debezium/inferred types merged, tables created and evolved."""

from __future__ import annotations

import json
import logging
from typing import Iterable

from pyspark.sql import SparkSession

from connector.errors import SchemaConflictError
from iceberg.layouts import META_COLUMNS, STALE_COLUMNS, TOMBSTONE_EXTRA, TableNames

log = logging.getLogger(__name__)

META_NAMES = {name for name, _ in META_COLUMNS}
WIDENINGS = {("int", "bigint"), ("float", "double")}
TABLE_PROPERTIES = (
    "'format-version'='2', 'write.delete.mode'='merge-on-read', "
    "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read'"
)


def merge_types(signatures: Iterable[str]) -> dict[str, str]:
    """Union of `after_types` JSON documents; int+bigint -> bigint, bigint+double -> double."""
    merged: dict[str, str] = {}
    for sig in signatures:
        for col, t in json.loads(sig).items():
            old = merged.get(col)
            if old is None or old == t:
                merged[col] = t
            elif (old, t) in WIDENINGS or {old, t} == {"bigint", "double"}:
                merged[col] = t if (old, t) in WIDENINGS else "double"
            elif (t, old) in WIDENINGS:
                pass
            else:
                raise SchemaConflictError(f"column {col!r} arrives as both {old} and {t} in one compaction round")
    return merged


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def existing_columns(spark: SparkSession, table: str) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in spark.table(table).schema.fields}


def ensure_tables(spark: SparkSession, names: TableNames) -> None:
    meta = ", ".join(f"{quote(n)} {t}" for n, t in META_COLUMNS)
    extra = ", ".join(f"{quote(n)} {t}" for n, t in TOMBSTONE_EXTRA)
    stale = ", ".join(f"{quote(n)} {t}" for n, t in STALE_COLUMNS)
    for name, cols in ((names.state, meta), (names.tombstones, f"{meta}, {extra}"), (names.stale, stale)):
        spark.sql(f"CREATE TABLE IF NOT EXISTS {names.spark(name)} ({cols}) USING iceberg "
                  f"TBLPROPERTIES ({TABLE_PROPERTIES})")


def evolve(spark: SparkSession, names: TableNames, wanted: dict[str, str]) -> dict[str, str]:
    """Adds new columns, widens int->bigint and float->double; returns the data columns.

    Raises SchemaConflictError naming the column when a type cannot be stored.
    """
    table = names.spark(names.state)
    have = {c: t for c, t in existing_columns(spark, table).items() if c not in META_NAMES}
    for col, t in wanted.items():
        if col in META_NAMES:
            raise SchemaConflictError(f"source column {col!r} of {names.state} collides with a metadata column")
        old = have.get(col)
        if old is None:
            spark.sql(f"ALTER TABLE {table} ADD COLUMNS ({quote(col)} {t})")
            log.info("%s: added column %s %s", names.state, col, t)
        elif old != t and (old, t) in WIDENINGS:
            spark.sql(f"ALTER TABLE {table} ALTER COLUMN {quote(col)} TYPE {t}")
            log.info("%s: widened column %s %s -> %s", names.state, col, old, t)
        elif old != t and (t, old) not in WIDENINGS and not old.startswith("decimal"):
            raise SchemaConflictError(
                f"{names.state}.{col} is {old} but new events carry {t}; Iceberg cannot promote {old} to {t}. "
                f"Add a new column in the source, or recreate {names.state} (it is rebuilt from {names.log})"
            )
    return {c: t for c, t in existing_columns(spark, table).items() if c not in META_NAMES}

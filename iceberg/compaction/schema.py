"""State-table columns: Debezium/inferred types merged, tables created and evolved."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from iceberg import compat_spark
from iceberg.layouts import META_COLUMNS, STALE_COLUMNS, TOMBSTONE_EXTRA, TableNames

log = logging.getLogger(__name__)

META_NAMES = {name for name, _ in META_COLUMNS}
WIDENINGS = {("int", "bigint"), ("float", "double")}
# Format 3: a MERGE's deletes are one deletion vector per data file, merged with the file's
# earlier ones, where format 2 adds a position-delete file per round that later reads apply
TABLE_PROPERTIES = {
    "format-version": "3",
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
}


@dataclass(frozen=True)
class ColumnPlan:
    """What a round does to the state table's columns, and which after-image signatures it
    refuses (signature JSON -> why: the column and both types), so that no event can block
    the table: those events become dead letters (reason `schema`) and the round goes on."""

    columns: dict[str, str]  # every data column after the round, with its type
    add: dict[str, str] = field(default_factory=dict)  # new columns (one schema change)
    widen: dict[str, str] = field(default_factory=dict)  # int -> bigint, float -> double
    refused: dict[str, str] = field(default_factory=dict)


def _fits(held: str, incoming: str, new: bool) -> str | None:
    """The type a column of type `held` takes to store values of type `incoming`, or None.
    A column this round adds takes integers and floats together as double (schemaless JSON
    writes 1 for 1.0); one the table has cannot become double (Iceberg cannot promote it)."""
    if held == incoming or (incoming, held) in WIDENINGS:
        return held
    if (held, incoming) in WIDENINGS:
        return incoming
    if new and {held, incoming} <= {"int", "bigint", "float", "double"}:
        return "double"
    if held.startswith("decimal") and incoming in ("int", "bigint"):
        return held  # integers fit a decimal column exactly (Spark checks the precision)
    return None


def plan_columns(existing: dict[str, str], signatures: Iterable[str], max_new: int) -> ColumnPlan:
    """The columns of the round from the table's columns and the winners' `after_types`
    signatures, taken in sorted order: a signature that a column cannot hold (a type Iceberg
    cannot promote to, a name that differs from another only in case, a metadata column's
    name, more than `max_new` new columns in the round) is refused whole."""
    columns, add, widen = dict(existing), dict[str, str](), dict[str, str]()
    refused: dict[str, str] = {}
    by_lower = {c.lower(): c for c in columns}
    for sig in sorted(signatures):
        types = json.loads(sig)
        trial: dict[str, str] = {}
        trial_add: dict[str, str] = {}
        trial_widen: dict[str, str] = {}
        why: str | None = None
        for col, t in types.items():
            held = trial.get(col, columns.get(col))
            if col in META_NAMES:
                why = f"column {col!r} has the name of a metadata column"
            elif held is None and by_lower.get(col.lower(), col) != col:
                why = f"column {col!r} differs only in case from the table's {by_lower[col.lower()]!r}"
            elif held is None:
                trial[col] = trial_add[col] = t
            elif (fit := _fits(held, t, col not in existing)) is None:
                why = (
                    f"column {col!r} is {held} in the table but {t} in this event; Iceberg cannot promote {held} to {t}"
                )
            elif fit != held:
                if col in existing and col not in add:
                    trial_widen[col] = fit
                else:
                    trial_add[col] = fit
                trial[col] = fit
            if why:
                break
        if why is None and len(add.keys() | trial_add.keys()) > max_new:
            why = (
                f"the round would add more than {max_new} columns (limits.max_new_columns); "
                f"this event brings {len(trial_add)} new"
            )
        if why:
            refused[sig] = why
            continue
        columns.update(trial)
        add.update(trial_add)
        widen.update(trial_widen)
        by_lower.update({c.lower(): c for c in trial_add})
    return ColumnPlan(columns, add, widen, refused)


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def existing_columns(spark: SparkSession, table: str) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in spark.table(table).schema.fields}


def ensure_tables(spark: SparkSession, names: TableNames) -> None:
    """The state, tombstones and stale events tables, each created where it does not exist
    (`CREATE TABLE IF NOT EXISTS`, through Spark's catalog API: `compat_spark.create_tables`)."""
    meta = ", ".join(f"{quote(n)} {t}" for n, t in META_COLUMNS)
    extra = ", ".join(f"{quote(n)} {t}" for n, t in TOMBSTONE_EXTRA)
    stale = ", ".join(f"{quote(n)} {t}" for n, t in STALE_COLUMNS)
    columns = {names.state: meta, names.tombstones: f"{meta}, {extra}", names.stale: stale}
    compat_spark.create_tables(spark, names.catalog, columns, TABLE_PROPERTIES)


def evolve(spark: SparkSession, names: TableNames, plan: ColumnPlan) -> None:
    """Applies a column plan: all new columns in one schema change, then the widenings."""
    table = names.spark(names.state)
    if plan.add:
        spark.sql(f"ALTER TABLE {table} ADD COLUMNS ({', '.join(f'{quote(c)} {t}' for c, t in plan.add.items())})")
        log.info("%s: added columns %s", names.state, plan.add)
    for col, t in plan.widen.items():
        spark.sql(f"ALTER TABLE {table} ALTER COLUMN {quote(col)} TYPE {t}")
        log.info("%s: widened column %s to %s", names.state, col, t)


def data_columns(spark: SparkSession, names: TableNames) -> dict[str, str]:
    return {c: t for c, t in existing_columns(spark, names.spark(names.state)).items() if c not in META_NAMES}

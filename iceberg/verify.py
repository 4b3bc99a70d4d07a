"""`cdclake verify` and `cdclake rebuild`: recompute a table's state and tombstones from its
log, then compare them with the tables, or put them in their place.

The recomputation is a full compaction of the log's retained events, in one round, into
scratch tables of a namespace of its own (`cdclake_verify_<id>`, dropped afterwards): the
log is registered there read-only (the same metadata file; the round does no maintenance,
so nothing is committed to it). One round over the whole log ends where the rounds that
built the table ended (the compaction contract, property-tested). Then, by key: a key the
recomputation has and the table lacks is `missing`, the reverse `extra`, the same key at
another log position `different offset`, and the same position with other column values
`different row`. A tombstone whose deleting event is older than the tombstone retention may
have been purged: its absence is not a difference.

`rebuild` holds the table's compaction lease, and overwrites the tombstones, then the state
(with the recomputation's summary entries that `summary_keys` says rebuild keeps: cleaner
points, truncate marker, ordering rule and bytes, in the same commit), each in one snapshot:
a reader of either table sees it whole before or whole after.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pyiceberg.catalog import Catalog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connector.core.errors import ConnectorError
from iceberg.compaction.policy import CompactionPolicy
from iceberg.layouts import META_COLUMNS, POSITION_TEXT, TableNames

KINDS = ("missing", "extra", "different offset", "different row")


class RebuildRefusedError(ConnectorError):
    """The log no longer holds what a rebuild would need (trimmed by log retention)."""


SAMPLE = 10  # keys shown per kind


@dataclass
class VerifyReport:
    table: str
    events: int = 0  # of the log, recomputed from
    horizon: dict[str, tuple[int, int]] = field(default_factory=dict)  # stream -> (first, last) sequence number
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # state / tombstones -> kind -> keys
    samples: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(n for kinds in self.counts.values() for n in kinds.values())


def _classify(mine: DataFrame, theirs: DataFrame, columns: list[str]) -> DataFrame:
    """(_key, kind) of each differing key: `mine` is the table, `theirs` the recomputation."""
    sig = F.xxhash64(*[F.col(c).cast("string") for c in columns])
    a = mine.select("_key", "_partition_id", "_offset", sig.alias("_sig"))
    b = theirs.select("_key", F.col("_partition_id").alias("p2"), F.col("_offset").alias("o2"), sig.alias("s2"))
    joined = a.join(b, "_key", "full_outer")
    kind = (
        F.when(F.col("_offset").isNull(), "missing")
        .when(F.col("o2").isNull(), "extra")
        .when((F.col("_partition_id") != F.col("p2")) | (F.col("_offset") != F.col("o2")), "different offset")
        .when(F.col("_sig") != F.col("s2"), "different row")
    )
    return joined.select("_key", kind.alias("kind")).where(F.col("kind").isNotNull())


@contextmanager
def recomputed(
    spark: SparkSession, catalog: Catalog, names: TableNames, policy: CompactionPolicy, now: datetime
) -> Iterator[TableNames]:
    """The table's state and tombstones recomputed from its log, in scratch tables (the names
    yielded), dropped on exit."""
    from iceberg.compaction.job import compact

    log = catalog.load_table(names.log)
    scratch = TableNames(names.catalog, f"cdclake_verify_{uuid.uuid4().hex[:8]}", names.table)
    catalog.create_namespace(scratch.namespace)
    try:
        catalog.register_table(scratch.log, log.metadata_location)
        quiet = dataclasses.replace(  # nothing committed to the log: no retention, no maintenance
            policy,
            min_compaction_lag=timedelta(0),
            log_retention=None,
            maintenance=dataclasses.replace(policy.maintenance, enabled=False),
        )
        compact(spark, catalog, scratch, quiet, now, force=True)
        yield scratch
    finally:
        for name in (scratch.state, scratch.tombstones, scratch.stale, scratch.dead_letters):
            spark.sql(f"DROP TABLE IF EXISTS {scratch.spark(name)} PURGE")
        if catalog.table_exists(scratch.log):
            catalog.drop_table(scratch.log)  # the registration only: the files are the log's
        catalog.drop_namespace(scratch.namespace)


def _horizon(spark: SparkSession, names: TableNames, report: VerifyReport) -> None:
    bounds = (
        spark.table(names.spark(names.log))
        .groupBy("topic", "partition")
        .agg(F.min("sequence_number"), F.max("sequence_number"), F.count(F.lit(1)))
        .collect()
    )
    report.horizon = {f"{t}:{p}": (lo, hi) for t, p, lo, hi, _ in bounds}
    report.events = sum(n for *_, n in bounds)


def verify(
    spark: SparkSession, catalog: Catalog, names: TableNames, policy: CompactionPolicy, now: datetime
) -> VerifyReport:
    report = VerifyReport(names.table)
    with recomputed(spark, catalog, names, policy, now) as scratch:
        _horizon(spark, names, report)
        meta = [n for n, _ in META_COLUMNS]
        purgeable = now.astimezone(UTC) - policy.tombstone_retention
        for kind, name in (("state", names.state), ("tombstones", names.tombstones)):
            table, again = spark.table(names.spark(name)), spark.table(scratch.spark(getattr(scratch, kind)))
            both = set(table.columns) & set(again.columns)  # a table made before a meta column lacks it
            columns = [c for c in meta if c in both] if kind == "tombstones" else sorted(both)
            if kind == "tombstones":  # one old enough to have been purged is compared only where the table has it
                held = table.select("_key")
                again = again.join(held, "_key", "left_semi").unionByName(
                    again.where(F.col("_enqueued_time") > F.lit(purgeable)).join(held, "_key", "left_anti")
                )
            found = (
                _classify(table, again, columns)
                .groupBy("kind")
                .agg(
                    F.count(F.lit(1)).alias("n"),
                    F.slice(F.sort_array(F.collect_list("_key")), 1, SAMPLE).alias("keys"),
                )
                .collect()
            )
            report.counts[kind] = {k: 0 for k in KINDS} | {r["kind"]: r["n"] for r in found}
            report.samples[kind] = {r["kind"]: list(r["keys"]) for r in found}
    return report


def rebuild(
    spark: SparkSession,
    catalog: Catalog,
    names: TableNames,
    policy: CompactionPolicy,
    now: datetime,
    wait: float = 0.0,
) -> VerifyReport:
    """Replaces the state and tombstones with their recomputation (module docstring); the
    report's horizon says from which events."""
    from iceberg import leases
    from iceberg.compaction import schema, writes
    from iceberg.summary_keys import ORDERING, TRIMMED_BEFORE, TableKind, rebuild_entries

    report = VerifyReport(names.table)
    built_by = ORDERING.read(catalog.load_table(names.state)) if catalog.table_exists(names.state) else None
    trimmed = TRIMMED_BEFORE.read(catalog.load_table(names.log))
    if trimmed and built_by and built_by != policy.ordering:
        raise RebuildRefusedError(
            f"table {names.state}: built by the {built_by!r} ordering rule, and log retention removed the events "
            f"enqueued before {trimmed.isoformat()} that were not its winners; under the {policy.ordering!r} rule "
            "some of them may win, so the log no longer holds what a rebuild needs. Keep the ordering rule, or "
            "rebuild from a complete copy of the log"
        )
    lease = leases.acquire(catalog, names.state, "compaction", wait)
    try:
        with recomputed(spark, catalog, names, policy, now) as scratch:
            _horizon(spark, names, report)
            schema.ensure_tables(spark, names)
            replaced: list[tuple[TableKind, str, str]] = [
                ("tombstones", names.tombstones, scratch.tombstones),
                ("state", names.state, scratch.state),
            ]
            for kind, name, built in replaced:
                props = rebuild_entries(catalog.load_table(built), kind)
                have = set(spark.table(names.spark(name)).columns)
                # a table made before the position's text stays without it: added here, it would
                # be null in every row until the overwrite commits (a round would read it)
                fields = [
                    f
                    for f in spark.table(scratch.spark(built)).schema.fields
                    if f.name in have or f.name != POSITION_TEXT
                ]
                new = [f for f in fields if f.name not in have]
                if new:
                    cols = ", ".join(f"{schema.quote(f.name)} {f.dataType.simpleString()}" for f in new)
                    spark.sql(f"ALTER TABLE {names.spark(name)} ADD COLUMNS ({cols})")
                cols = ", ".join(schema.quote(f.name) for f in fields)
                lease.renew()
                sql = f"INSERT OVERWRITE {names.spark(name)} ({cols}) SELECT {cols} FROM {scratch.spark(built)}"
                writes.write(spark, catalog, name, sql, props)
    finally:
        lease.release()
    return report

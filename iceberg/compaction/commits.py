"""A compaction round's state and its last steps (`iceberg.compaction.job`, steps 5 - 8): the
writes of its tables, each in a commit of its own, then the upkeep. `job.Round` adds the plan
and the read, which set what these steps write.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pyiceberg.catalog import Catalog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connector.core.faults import crash_point
from connector.core.ordering import Truncate
from iceberg import leases
from iceberg.compaction import schema, writes
from iceberg.compaction.policy import CompactionPolicy
from iceberg.compaction.quiet import upkeep
from iceberg.compaction.report import CompactionReport, Steps, earliest_expiry, may_expire
from iceberg.compaction.retain import purge_predicate
from iceberg.compaction.retention import trim
from iceberg.compaction.stats import StreamStats, sum_streams
from iceberg.layouts import TOMBSTONE_EXTRA, TableNames, meta_names
from iceberg.maintenance import maintain
from iceberg.summary_keys import (
    CLEANER_POINTS,
    DIRTY,
    EXPIRES_FROM,
    LOG_SEEN,
    NEVER,
    ORDERING,
    ROUND_RANGES,
    STALE_REASONS,
    STREAM_BYTES,
    TRUNCATE,
)
from quotas.metrics import compacted_up_to


class RoundCommits:
    """What a round of one source table finds, step by step, and its steps that write and keep
    its tables. The plan and the read (`job.Round`) set `ranges`, `dirty_left` and `changes`
    before these run."""

    ranges: list[StreamStats]  # the planned streams' statistics, in the plan's order
    dirty_left: dict[str, list[int]]  # per stream, what the round leaves dirty (`quiet.left_dirty`)
    changes: DataFrame  # what the newest change per key does (`job.Round.resolve`)
    upkept: Any  # the catalog of the upkeep's decisions, a `catalog.Loaded` (`job.Round.finish`)

    def __init__(
        self,
        spark: SparkSession,
        catalog: Catalog,
        names: TableNames,
        policy: CompactionPolicy,
        now: datetime,
        lease: leases.Lease | None = None,
    ):
        self.spark, self.catalog, self.names, self.policy, self.now = spark, catalog, names, policy, now
        self.report = CompactionReport(names.table)
        self.step = Steps(names.state, lease)
        self.truncates: list[Truncate] = []  # the round's own truncates newer than the marker, oldest first
        self.truncate: Truncate | None = None  # the newest of them
        self.table_truncate: Truncate | None = None  # the marker after the round
        self.late: DataFrame | None = None  # changes older than the marker: stale
        # Of the state and tombstones, those holding rows, and the table's truncate marker and
        # cleaner points, as the plan found them (only the round, which holds the lease, writes
        # them until it ends)
        self.holding: list[str] = []
        self.held_count: int | None = None  # the rows they hold (None: not known)
        self.marker: Truncate | None = None
        self.points: dict[str, int] = {}
        self.held_rows: DataFrame | None = None
        self.held_bounds: dict[str, Any] = {}
        # per table with rows, the keys it holds among the round's (None: not collected, its
        # MERGE joins the whole table; a table not here holds none)
        self.held_keys: dict[str, list[str] | None] = {}
        self.ranked: DataFrame | None = None
        self.stale_rows: DataFrame | None = None
        self.columns = schema.ColumnPlan({})  # the state's columns after the round, and what it changes
        self.bytes: dict[str, dict[str, int]] = {}  # per table (state, tombstones): bytes per stream
        # the log's snapshot the plan read, where the round leaves no event of it dirty
        self.log_seen: int | None = None
        # per table ('s', 't') and stream: the bytes the changes add (`writes.bytes_delta`)
        self.delta: dict[str, dict[str, int]] | None = None
        # the changes carry the rows their keys held, with where they are (`read_dirty`): the
        # round writes by `writes.commit_delta`, not by MERGE
        self.carried = False
        # per table (state, tombstones), the snapshot the plan found (None: none yet)
        self.based: dict[str, int | None] = {}
        # per table (state, tombstones): whether it has `layouts.POSITION_TEXT` (or will: none yet)
        self.texts: dict[str, bool] = {}
        # at or before the tombstones' earliest expiry (`EXPIRES_FROM`; None: not known)
        self.expires_from: datetime | None = None

    def recorded(self, name: str) -> dict[str, str]:
        """The snapshot properties recording the bytes per stream `name` holds and, for the
        tombstones, their earliest expiry where it is known."""
        expiry = self.expires_from if name == self.names.tombstones else None
        return {
            **STREAM_BYTES.entry({s: b for s, b in self.bytes[name].items() if b}),
            **(EXPIRES_FROM.entry(expiry) if expiry is not None else {}),
        }

    def write_tombstones(self) -> None:
        """5. The tombstones: a delete's own, removed for a key written or truncated (nothing
        to write in a round without deletes whose keys hold no tombstone)."""
        tombstones = self.names.tombstones
        held = self.held_keys.get(tombstones, [])
        if self.report.deletes or held != []:
            retention = int(self.policy.tombstone_retention.total_seconds())
            if self.report.deletes and self.expires_from is not None:  # each new tombstone's `expires_at`
                self.expires_from = min(
                    self.expires_from, self.now + min(timedelta(seconds=retention), NEVER - self.now)
                )
            source = writes.tombstone_source(self.changes, self.now, retention)
            if self.carried:
                self.commit_delta(tombstones, "_held_t", source, "delete", self.recorded(tombstones))
            else:
                source.createOrReplaceTempView("cdclake_tomb_changes")
                columns = meta_names(self.texts[tombstones]) + [n for n, _ in TOMBSTONE_EXTRA]
                sql = writes.write_sql(self.names.spark(tombstones), "cdclake_tomb_changes", columns, "delete", held)
                writes.write(self.spark, self.catalog, tombstones, sql, self.recorded(tombstones))
            self.step("write tombstones")
        crash_point("compact.after-tombstones")

    def write_stale(self) -> None:
        """The stale events into `<t>__stale` (idempotent: a replayed round finds them there)."""
        if self.stale_rows is None:
            return
        self.stale_rows.createOrReplaceTempView("cdclake_stale")
        target = self.names.spark(self.names.stale)
        writes.insert_missing(self.spark, target, "cdclake_stale", ["_topic", "_partition_id", "_sequence_number"])
        self.step("stale events")

    def write_state(self) -> None:
        """6. The state, with the cleaner points, the truncate marker and the round's figures
        in the same snapshot."""
        catalog, names, report = self.catalog, self.names, self.report
        source = writes.state_source(self.changes, self.columns.columns)
        points = {**self.points, **{r.stream: r.end for r in report.ranges}}
        props = {
            **CLEANER_POINTS.entry(points),
            **ROUND_RANGES.entry(report.summary()["ranges"]),
            **STALE_REASONS.entry(report.stale_reasons),
            **ORDERING.entry(self.policy.ordering),
            **(LOG_SEEN.entry(self.log_seen) if self.log_seen is not None else {}),
            **DIRTY.entry(self.dirty_left),
            **(TRUNCATE.entry(self.table_truncate) if self.table_truncate else {}),
            **self.recorded(names.state),
        }
        if self.carried:  # all stale: the properties alone
            self.commit_delta(names.state, "_held_s", source, "upsert", props, self.columns)
        else:
            source.createOrReplaceTempView("cdclake_changes")
            sql = writes.write_sql(
                names.spark(names.state),
                "cdclake_changes",
                meta_names(self.texts[names.state]) + list(self.columns.columns),
                "upsert",
                self.held_keys.get(names.state, []),
            )
            writes.write(self.spark, catalog, names.state, sql, props)  # every event stale: the properties alone
        newest = [r.last_cleanable_time for r in self.ranges if r.last_cleanable_time is not None]
        if newest:
            compacted_up_to(names.table, max(newest))
        self.step("write state")
        crash_point("compact.after-commit")

    def commit_delta(
        self,
        name: str,
        column: str,
        source: DataFrame,
        keep: str,
        properties: dict[str, str],
        columns: schema.ColumnPlan | None = None,
    ) -> None:
        """What a MERGE of `source` into table `name` writes, where the changes carry the rows
        their keys held and where those are (`column` of `dedupe.HELD_COLUMNS`, in `source`):
        the rows whose `_action` is `keep` added, every row a changed key held in `name`
        removed by its position, in one commit (with the `columns` plan's column changes)."""
        writes.commit_delta(self.names.spark(name), source, keep, column, properties, self.based.get(name), columns)

    def purge(self) -> None:
        """7. Purge expired tombstones (idempotent, its own commit), where the tombstones'
        earliest expiry says one may have expired (`report.may_expire`); that commit records
        the remaining ones' earliest (a properties-only commit where none had expired)."""
        name = self.names.tombstones
        if not may_expire(self.catalog, name, self.now, self.expires_from):  # the round's own record
            self.step("purge")
            return
        tombstones, purge = self.names.spark(name), purge_predicate(self.now)
        gone = (
            self.spark.table(tombstones)
            .where(purge)
            .groupBy("_topic", "_partition_id")
            .agg(F.count(F.lit(1)), F.sum("_payload_bytes"))
            .collect()
        )
        self.report.purged = sum(n for _, _, n, _ in gone)
        self.expires_from = earliest_expiry(self.catalog.load_table(name), self.now)
        if self.report.purged:
            self.bytes[name] = sum_streams(self.bytes[name], {f"{t}:{p}": -(b or 0) for t, p, _, b in gone})
            writes.write(self.spark, self.catalog, name, f"DELETE FROM {tombstones} WHERE {purge}", self.recorded(name))
        else:
            writes.record(self.spark, tombstones, self.recorded(name))
        self.step("purge")

    def trim_log(self) -> None:
        """7b. Log retention (`iceberg.compaction.retention`)."""
        if self.policy.log_retention is not None:
            self.report.trimmed = trim(self.spark, self.upkept, self.names, self.now - self.policy.log_retention)
            self.step("log retention")

    def maintain(self) -> None:
        """8. Small files, deleted rows and the log's manifests rewritten, old snapshots expired."""
        names = self.names
        self.report.maintenance = maintain(
            self.spark, self.upkept, names.catalog, upkeep(self.upkept, names), self.policy.maintenance
        )
        self.step("maintenance")

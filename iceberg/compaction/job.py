"""The compaction job (the cleaner): a `Round` whose steps run in this order.

1. `plan`: per stream, the cleanable dirty range, whether it is due (pure planner), and the
   range's packing bounds, truncates and order (the planner's one pyiceberg scan of the log);
2. `read_dirty`, `read_held`: the dirty events (those older than the table's truncate marker
   are stale), the round's truncates, and the rows already held for the round's keys;
3. `newest_per_key`: the newest change per key (the dedupe transform: a hash aggregation of
   packed order keys where the round fits 63 bits, its streams are in order and it has no
   truncate, else the window, which applies truncates in turn) and what it does (upsert,
   delete, truncate); `record_stale`: the stale events;
4. `evolve_schema`: the columns the state can hold (the rest of the events: dead letters);
5. `write_tombstones`, `write_stale`; 6. `write_state`: the state with the new cleaner points
   and truncate marker in the same snapshot (a round without truncate, small or up to
   `DELTA_ROUND` events and `DELTA_BYTES` into tables holding rows, has its changes carry
   where the rows their keys held are, and 5 and 6 commit through Iceberg's API,
   `writes.commit_delta`; any other round MERGEs, into a table that holds none of its keys
   INSERTs, and each MERGE names the keys its table holds, up to `HELD_KEYS_MAX`);
7. `purge` expired tombstones; `trim_log`: log and dead-letter rows past the log retention
   that no key needs (below the cleaner point, not a winner, not a truncate); 8.
   `maintain`: rewrite small files (the log's manifests) and expire old snapshots when due
   (`iceberg.maintenance`). Steps 5 - 8 are in `iceberg.compaction.commits`.

Atomicity: the cleaner points live in the state table's snapshot. A crash after step 5
replays the same dirty range on the next run; replaying it over the already-written
tombstones yields the same changes, so the result equals one clean run.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from functools import cached_property, reduce

from pyiceberg.catalog import Catalog
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from connector.core.ordering import newest_truncate
from iceberg.catalog import Loaded
from iceberg.compaction import dedupe, schema, winners, writes
from iceberg.compaction.commits import RoundCommits
from iceberg.compaction.policy import CompactionPolicy, plan
from iceberg.compaction.quiet import left_dirty, seen_entries
from iceberg.compaction.report import CompactionReport, holds_rows, range_filter, round_truncates, total_rows, utc
from iceberg.compaction.stats import cleaner_points, held_bytes, load_optional, stream_stats, sum_streams
from iceberg.layouts import TableNames, has_position_text
from iceberg.summary_keys import EXPIRES_FROM, NEVER, STREAM_BYTES, TRUNCATE
from quotas.metrics import STALE

log = logging.getLogger(__name__)
# A round holding at most this many rows for its keys names them in its MERGEs (each key a
# literal in the statement: about 15 us a key to parse, against a shuffle of the whole table)
HELD_KEYS_MAX = 20_000
# A round of at most this many events sends its keys to every task of the held-rows lookup
# and of the bytes count
BROADCAST_ROUND = 100_000
# A round of at most this many events and bytes (as quotas count them) into a table holding
# rows writes without a MERGE (`writes.commit_delta`: its changes are collected into the
# driver's JVM and written there as one data file, the rows their keys held removed by
# position); a larger one MERGEs
DELTA_ROUND = 1_000_000
DELTA_BYTES = 256 << 20
# Such a round's held rows, up to this many, go to every task of their join with its winners
BROADCAST_HELD = 500_000


def compact(
    spark: SparkSession,
    catalog: Catalog,
    names: TableNames,
    policy: CompactionPolicy,
    now: datetime,
    force: bool = False,
    wait: float = 0.0,
) -> CompactionReport:
    """Compacts what is due in one source table; returns what it did. One round per table
    at a time: the round holds the table's `compaction` lease (waiting up to `wait` seconds
    for another holder) and renews it before each commit. The round runs as a pass's would
    (`shared.compact_tables`: a small one read as a group of one, its rows read in the
    driver's JVM), so whoever calls this runs the production route."""
    from iceberg.compaction.shared import compact_tables

    reports, failures = compact_tables(spark, catalog, [(names, policy)], utc(now), force, wait, 1)
    if failures:
        raise failures[0][1]
    return reports[0]


class Round(RoundCommits):
    """One compaction round of one source table: the module docstring's steps, each a method,
    and what a step finds is kept on the round for the next (the writes and the upkeep, 5 - 8,
    in `iceberg.compaction.commits`); a pass (`shared.compact_tables`) runs `begin`, then
    `read` or a shared read, then `finish`."""

    def begin(self, force: bool) -> None:
        """1. The plan."""
        self.started = time.monotonic()
        self.plan(force)

    def read(self) -> None:
        """2. - 3. What the round changes (`iceberg.compaction.shared` reads it for several
        rounds in one job and gives each its part)."""
        if self.report.ranges:
            self.read_dirty()
            self.read_held()
            self.newest_per_key()
            self.record_stale()

    def finish(self) -> CompactionReport:
        """4. - 8. The round's tables created where they are not yet (in the pass's pool: the
        tables of many rounds at once), the writes and the upkeep."""
        if not all(self.catalog.table_exists(t) for t in (self.names.state, self.names.tombstones, self.names.stale)):
            schema.ensure_tables(self.spark, self.names)
        if self.report.ranges:
            self.evolve_schema()
            self.write_tombstones()
            self.write_stale()
            self.write_state()
        else:
            self.record_seen()
        self.purge()
        self.upkept = Loaded(self.catalog)  # the tables as the writes left them, each loaded once
        self.trim_log()
        self.maintain()
        self.report.seconds = round(time.monotonic() - self.started, 3)
        log.info("compaction %s: %s", self.names.state, self.report.summary())
        return self.report

    def plan(self, force: bool) -> None:
        """1. Per stream, the cleanable range and whether it is due, with its packing bounds,
        truncates and order (the planner's one pyiceberg scan of the log)."""
        names = self.names
        log_table = self.catalog.load_table(names.log)
        seen = log_table.current_snapshot()  # the snapshot the plan reads
        self.log_seen = seen.snapshot_id if seen is not None else None
        tables = {t: load_optional(self.catalog, t) for t in (names.state, names.tombstones)}
        self.bytes = {t: held_bytes(table) for t, table in tables.items()}
        self.holding = [t for t, table in tables.items() if table is not None and holds_rows(table)]
        # what its tables hold, by their summaries (None: one does not say)
        counts = [total_rows(table) for table in tables.values() if table is not None]
        self.held_count = None if None in counts else sum(c or 0 for c in counts)
        for t, table in tables.items():
            snapshot = table.current_snapshot() if table is not None else None
            self.based[t] = snapshot.snapshot_id if snapshot is not None else None
        self.texts = {t: table is None or has_position_text(table) for t, table in tables.items()}
        state = tables[names.state]
        self.marker = TRUNCATE.read(state) if state is not None else None
        self.points = cleaner_points(state)
        tombstones = tables[names.tombstones]
        if tombstones is None or names.tombstones not in self.holding:
            self.expires_from = NEVER  # no tombstone
        else:
            self.expires_from = EXPIRES_FROM.read(tombstones, with_key=STREAM_BYTES)
        clean = sum_streams(*self.bytes.values())
        stats = {
            s.stream: s
            for s in stream_stats(
                self.catalog,
                names,
                self.policy,
                self.now,
                bounds=True,
                clean=clean,
                loaded={names.log: log_table, **tables},
            )
        }
        self.report.ranges = plan(list(stats.values()), self.policy, self.now, force)
        self.dirty_left = left_dirty(stats.values(), self.report.ranges, self.now)
        self.report.events = sum(stats[r.stream].cleanable_events for r in self.report.ranges)
        self.ranges = [stats[r.stream] for r in self.report.ranges]
        self.step("plan")

    @cached_property
    def dirty(self) -> DataFrame:
        """The round's dirty events, in the log (a round read together with others needs them
        only to refuse events: `evolve_schema`)."""
        return self.spark.table(self.names.spark(self.names.log)).where(range_filter(self.report.ranges))

    def record_seen(self) -> None:
        """A round with nothing due records the log's snapshot it planned against and what it
        left dirty (`quiet.seen_entries`)."""
        names = self.names
        props = seen_entries(self.catalog, names.state, self.log_seen, self.dirty_left, self.recorded(names.state))
        if props is not None:
            writes.record(self.spark, names.spark(names.state), props)
            self.step("log seen")

    def read_dirty(self) -> None:
        """2a. The dirty events; those older than the table's truncate marker arrive too late
        (stale, never candidates); the round's own newest truncate."""
        ordering = self.policy.ordering
        self.small = self.report.events <= self.policy.small_round
        self.events = winners.log_candidates(self.dirty, payload=self.small)
        marker = self.marker
        if marker is not None:
            ordered = self.events.withColumn(
                "_o",
                dedupe.candidate_order(ordering),
            )
            older = dedupe.older_than_truncate(marker, ordering)
            if ordering == "source":  # a position-less change is judged by the position it carries
                older = F.col("_source_position").isNotNull() & older
            self.late = ordered.where(older).withColumn("_stale", F.lit("older_than_truncate"))
            self.events = ordered.where(~older).drop("_o")
        if any(r.truncates for r in self.ranges):
            found = round_truncates(self.dirty, ordering)
            self.report.truncates = len(found)
            newer = [t for t in found if marker is None or t.newness(ordering) > marker.newness(ordering)]
            self.truncates, self.truncate = newer, newer[-1] if newer else None  # the held rows older go
            self.step(f"truncates of {self.report.events:,} dirty events")
        self.table_truncate = newest_truncate([marker, self.truncate], ordering)
        # see `newest_per_key`; a large first round INSERTs (written by every core)
        size = sum(r.cleanable_bytes for r in self.ranges)
        delta = self.small or (bool(self.holding) and self.report.events <= DELTA_ROUND and size <= DELTA_BYTES)
        self.carried = delta and self.truncate is None

    def read_held(self) -> None:
        """2b. The rows already held for the round's keys (every state row when a truncate
        may remove some; a first round has none: no joins at all), and their keys per table
        where there are at most `HELD_KEYS_MAX` of them and no truncate."""
        # Each pass reads the log files again (column pruned): materialising the order columns
        # measured slower (10M events over 10k keys: 27.7 s a round with it, 18.9 s without).
        self.narrow = self.events.select(*winners.ORDER_COLUMNS)
        held = [(t, op) for t, op in ((self.names.state, None), (self.names.tombstones, "d")) if t in self.holding]
        self.held_keys = dict.fromkeys(name for name, _ in held)
        if held:
            keys = self.narrow.select("_key")
            # a small round's keys go to every task as they are (no shuffle to make them distinct)
            keys = F.broadcast(keys) if self.report.events <= BROADCAST_ROUND else keys.distinct()
            frames = []
            for name, op in held:
                rows = winners.held(
                    self.spark.table(self.names.spark(name)), op, text=self.texts[name], at=self.carried
                )
                if not (self.truncate is not None and op is None):
                    rows = rows.join(keys, "_key", "left_semi")
                frames.append(winners.positions(rows, at=self.carried))
            # their packing bounds come with the checkpoint's own job
            bounds = Observation("cdclake_held_bounds")
            self.held_rows = (
                reduce(DataFrame.unionByName, frames)
                .observe(bounds, F.count(F.lit(1)).alias("rows"), *winners.candidate_bounds(self.policy.ordering))
                .localCheckpoint(eager=True)
            )
            self.held_bounds = bounds.get
            if self.truncate is None and not self.carried:  # else they come with its changes
                found = self.held_rows.select("_key", F.col("_op").eqNullSafe("d")).limit(HELD_KEYS_MAX + 1).collect()
                if len(found) <= HELD_KEYS_MAX:
                    for name, op in held:
                        self.held_keys[name] = [k for k, d in found if d == (op == "d")]
        self.step("held rows")

    def newest_per_key(self) -> None:
        """3. The newest change per key (packed where the round fits 63 bits and its streams
        are in order, else the window) and what it does: upsert, delete or truncate. A small
        round without truncate takes the window over candidates that carry their payload; its
        changes carry the rows their keys held (`dedupe.latest_per_key`), and the job that
        checkpoints them names the keys each table holds. A larger round's changes carry them
        too where it writes without a MERGE (`self.carried`: `dedupe.with_held`)."""
        ordering, held_rows = self.policy.ordering, self.held_rows
        candidates = self.events if held_rows is None else self.events.unionByName(held_rows, allowMissingColumns=True)
        if self.carried and self.small:
            ranked, seen = dedupe.rank(candidates, ordering), Observation("cdclake_keys")
            found = dedupe.latest_per_key(ranked, held=True).observe(
                seen, F.count(F.lit(1)).alias("n"), F.sum("_stale").alias("stale")
            )
            names = (self.names.state, self.names.tombstones)
            self.resolve(found, *[writes.held_keys(c).alias(name) for name, (c, _) in zip(names, dedupe.HELD_COLUMNS)])
            keys = seen.get
            self.report.keys, self.report.stale = keys["n"], keys["stale"] or 0
            self.ranked = ranked if self.report.stale else None
            for name in names:
                if name in self.holding:
                    held = self.observed[name]
                    self.held_keys[name] = held if len(held) <= HELD_KEYS_MAX else None
            return
        ordered = (
            self.narrow if held_rows is None else self.narrow.unionByName(held_rows.select(*winners.ORDER_COLUMNS))
        )
        bounds = reduce(dedupe.merge_bounds, [r.bounds for r in self.ranges if r.bounds is not None])
        if held_rows is not None:
            bounds = dedupe.merge_bounds(bounds, self.held_bounds)
        # the packed route cannot tell which changes arrived after a newer one (stale)
        packed = self.policy.packed and not self.small and all(r.monotone for r in self.ranges)
        packing = dedupe.Packing.of(bounds) if packed else None
        multi_topic = len({r.topic for r in self.report.ranges}) > 1
        found, self.ranked, self.report.keys, self.report.stale = winners.newest(
            candidates,
            ordered,
            held_rows,
            self.dirty,
            packing,
            ordering,
            multi_topic,
            sorted({r.partition for r in self.report.ranges}),
            self.truncates,
            self.step,
            self.small,
        )
        if not self.carried:
            self.resolve(found)
            return
        names = (self.names.state, self.names.tombstones)
        assert held_rows is not None, "a large round writes without a MERGE only into a table holding rows"
        self.resolve(
            dedupe.with_held(found, held_rows, broadcast=self.held_bounds["rows"] <= BROADCAST_HELD),
            *[F.count(F.col(c)).alias(name) for name, (c, _) in zip(names, dedupe.HELD_COLUMNS)],
        )
        for name in names:  # whether each holds a row of the round's keys
            if name in self.holding:
                self.held_keys[name] = [] if not self.observed[name] else None

    def resolve(self, found: DataFrame, *observe: Column) -> None:
        """What the newest change per key does (`self.changes`), with the counts, the after-image
        signatures and the aggregates `observe` from the checkpoint's own job (`self.observed`).
        One partition per core: the winners come in one per split of the log, 88 at 10M events,
        and each would be a file of its own where the state is written by INSERT."""
        upsert, observed = F.col("_action") == "upsert", Observation("cdclake_changes")
        self.changes = (
            dedupe.resolve(found, self.truncate, self.policy.ordering)
            .coalesce(self.spark.sparkContext.defaultParallelism)
            .observe(
                observed,
                F.count(F.lit(1)).alias("n"),
                F.sum(upsert.cast("int")).alias("up"),
                F.sum((F.col("_action") == "truncate").cast("int")).alias("cut"),
                F.collect_set(F.when(upsert, F.col("_after_types"))).alias("signatures"),  # nulls are left out
                *observe,
            )
            .localCheckpoint(eager=True)
        )
        self.observed = counts = observed.get
        self.signatures = counts["signatures"]
        self.report.upserts, self.report.truncated = counts["up"] or 0, counts["cut"] or 0
        self.report.deletes = (counts["n"] or 0) - self.report.upserts - self.report.truncated
        self.step("payload of the winners")

    def record_stale(self) -> None:
        """The stale events (only the window finds them among the candidates, so `ranked` is
        set then; and those older than the truncate marker), counted by reason."""
        found = [f for f in ((self.ranked if self.report.stale else None), self.late) if f is not None]
        if not found:
            return
        rows = writes.stale_rows(found, self.now)
        # the counts first (one job; usually none), the rows only when there are some
        reasons = {r["reason"]: r["n"] for r in rows.groupBy("reason").agg(F.count(F.lit(1)).alias("n")).collect()}
        if reasons:
            self.note_stale(reasons, rows.localCheckpoint(eager=True))

    def note_stale(self, reasons: dict[str, int], rows: DataFrame) -> None:
        """The round's stale events (`rows`), counted by reason."""
        self.report.stale_reasons, self.report.stale = reasons, sum(reasons.values())
        self.stale_rows = rows
        for reason, n in reasons.items():
            STALE.labels(self.names.table, reason).inc(n)
        log.warning(
            "%s: %s stale events ignored (%s), recorded in %s",
            self.names.state,
            self.report.stale,
            reasons,
            self.names.stale,
        )

    def evolve_schema(self) -> None:
        """4. The state takes every column it can; an event it cannot hold is a dead letter.
        A round that writes through Iceberg's API changes the columns in its state's commit."""
        names = self.names
        plan = schema.plan_columns(schema.data_columns(self.spark, names), self.signatures, self.policy.max_new_columns)
        if plan.refused:
            self.changes, self.report.refused = writes.refuse(
                self.spark, self.catalog, names, self.changes, self.dirty, plan.refused, self.now
            )
            self.report.upserts -= self.report.refused
            self.delta = None  # counted again without the refused changes
        if not self.carried:
            schema.evolve(self.spark, names, plan)
        elif plan.add or plan.widen:
            log.info("%s: adds columns %s and widens %s with its state's commit", names.state, plan.add, plan.widen)
        self.columns = plan
        self.count_bytes()
        self.step("schema")

    def count_bytes(self) -> None:
        """The bytes per stream the state and tombstones will hold after the round's MERGEs
        (recorded with them for ingest's quota usage; a shared read counted them already)."""
        if self.delta is None:
            small = self.report.events <= BROADCAST_ROUND
            delta = writes.bytes_delta(self.changes, self.held_rows, broadcast=small, carried=self.carried)
            self.delta = delta.get((), {})
        for t, name in (("s", self.names.state), ("t", self.names.tombstones)):
            self.bytes[name] = sum_streams(self.bytes[name], self.delta.get(t, {}))

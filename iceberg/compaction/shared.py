"""A pass over many tables: their rounds planned, then the small ones read together, then each
written on its own.

A small round (at most `small_round` events, the general route with their payload) costs
mostly the fixed cost of its Spark queries: the read of its dirty events and held rows, the
newest change per key, the counts, the bytes per stream. `read_together` runs those queries
once for a group of such rounds: each table's keys carry the table's index in the group
(`3/key`), so the ordering rule's window and aggregation, which work per key, work per table
and key. Each round then takes its part (`Share.give`) and writes its own tables with its own
commits, as a round alone would: the atomicity, the lease and the crash points are the
round's. A round with a truncate (its own, or a marker from an earlier one) reads alone.
The rounds' writes stay a commit per table (through Iceberg's API: `writes.commit_delta`),
and those, not loading the tables (a few ms each), are most of a small round's cost
(docs/performance.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from functools import reduce
from typing import Any

from pyiceberg.catalog import Catalog
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from iceberg import compat_spark, leases
from iceberg.columns import once_per_context
from iceberg.compaction import dedupe, winners, writes
from iceberg.compaction.checkpoints import releasing_checkpoints
from iceberg.compaction.job import BROADCAST_ROUND, HELD_KEYS_MAX, Round
from iceberg.compaction.policy import CompactionPolicy
from iceberg.compaction.report import CompactionReport, range_filter
from iceberg.layouts import TableNames

log = logging.getLogger("iceberg.compaction.job")
GROUP_TABLES = 50  # rounds read in one shared job at most
# A shared read of more events than this compiles its queries' code: each row interpreted costs
# more than compiling, and Spark reuses what it compiled for a plan of the same shape
COMPILED_EVENTS = 50_000
READ_CHUNKS = 4  # the shared read's queries: its tables in this many chunks, read at once
# A round whose state and tombstones hold at most this many rows reads its tables in the
# driver's JVM (`compat_spark.jvm_reads`: no Spark scan per table; the rows read one at a time)
JVM_ROWS = 100_000
# A chunk of the shared read of at most this many events, read in the driver's JVM, is read
# by the queries after it as it is (local relations: Spark's analysis walks each of their rows
# in every frame built on them, so a larger chunk's rows are checkpointed first)
LOCAL_EVENTS = 10_000


def _table() -> Column:
    """The table's index in its group, from the key it prefixes."""
    return F.substring_index(F.col("_key"), "/", 1).cast("int")


def _prefix(i: int) -> str:
    """What the keys of the table of index `i` in its group are prefixed with."""
    return f"{i}/"


@once_per_context
def _prefixed(i: int) -> Column:
    """The key prefixed with the table's index in its group (`i/`)."""
    return F.concat(F.lit(_prefix(i)), F.col("_key"))


def _union(frames: list[DataFrame]) -> DataFrame:
    """The rows of `frames` (the same columns, in the same order), unioned in a balanced tree:
    the analysis of each union walks the plan under it, so a chain of n unions walks O(n^2)
    nodes (the optimizer makes either one union of n)."""
    while len(frames) > 1:
        frames = [reduce(DataFrame.union, frames[i : i + 2]) for i in range(0, len(frames), 2)]
    return frames[0]


def _own_keys(rows: DataFrame) -> DataFrame:
    """`rows` with each key as its table has it (without the table's index)."""
    return rows.withColumn("_key", F.expr("substr(_key, instr(_key, '/') + 1)"))


def readable_in_jvm(r: Round) -> bool:
    """Whether a shared read takes the round's rows in the driver's JVM: its tables hold at most
    `JVM_ROWS` rows by their summaries, each with the position's text."""
    return r.held_count is not None and r.held_count <= JVM_ROWS and all(r.texts[t] for t in r.holding)


def shareable(r: Round) -> bool:
    """A planned round that `read_together` can read: events to compact, at most
    `small_round` of them, and no truncate among them or before them (the table's marker)."""
    return (
        bool(r.report.ranges)
        and r.report.events <= r.policy.small_round
        and not any(s.truncates for s in r.ranges)
        and r.marker is None
    )


@dataclass(frozen=True)
class Share:
    """A round's part of a shared read: its rows of the changes and of the stale events (None
    without stale events), held in the driver's JVM by table (`compat_spark.in_parts`), by its
    `index` in the group."""

    changes: Any
    stale: Any | None
    index: int
    reasons: dict[str, int]

    def give(self, r: Round, session: SparkSession) -> None:
        """Sets what `Round.read` would on `r`, as frames of `session` (its round's own)."""
        r.spark = session
        # with the rows their keys held
        r.changes, r.carried = compat_spark.part(self.changes, session, self.index), True
        if self.stale is not None and self.reasons:
            r.note_stale(self.reasons, compat_spark.part(self.stale, session, self.index))


def read_together(spark: SparkSession, rounds: list[Round]) -> dict[int, Share]:
    """Reads the planned `rounds` (all `shareable`, one ordering) in shared jobs and sets on each
    what its own `read` would, but for its frames: per round (by `id`) its `Share` of the rows."""
    started = time.monotonic()
    ordering = rounds[0].policy.ordering

    def frames(i: int, r: Round) -> tuple[DataFrame, list[DataFrame]]:
        """The round's dirty events and the rows its tables hold (each frame analysed in the
        driver's JVM as it is built; py4j lets the threads wait for it in parallel)."""
        dirty = spark.table(r.names.spark(r.names.log)).where(range_filter(r.report.ranges))
        rows = [
            winners.held(spark.table(r.names.spark(name)), op, text=r.texts[name], at=True, key=_prefixed(i))
            for name, op in ((r.names.state, None), (r.names.tombstones, "d"))
            if name in r.holding
        ]
        return winners.log_candidates(dirty, payload=True, key=_prefixed(i)), rows

    def in_jvm(indexes: list[int]) -> tuple[DataFrame, list[DataFrame]]:
        """The dirty events of the rounds `indexes` and the rows their tables hold for their
        keys, read in the driver's JVM (`compat_spark.jvm_reads`), their keys prefixed."""
        rs = [rounds[i] for i in indexes]
        ranges = [[x for c in r.report.ranges for x in (c.topic, c.partition, c.start, c.end)] for r in rs]
        events, held = compat_spark.jvm_reads(
            spark,
            [r.names.spark(r.names.log) for r in rs],
            [_prefix(i) for i in indexes],
            ranges,
            [log for log, _ in winners.LOG_CANDIDATES],
        )
        found = []
        for tables, op in (([r.names.state for r in rs], None), ([r.names.tombstones for r in rs], "d")):
            rows = held([r.names.spark(t) if t in r.holding else None for r, t in zip(rs, tables)], winners.HELD_READS)
            if rows is not None:
                found.append(winners.held(rows, op, text=True, at=True))
        return winners.log_candidates(events, payload=True), found

    many = sum(r.report.events for r in rounds) > BROADCAST_ROUND

    def read(chunk: list[int]) -> tuple[DataFrame, DataFrame | None]:
        """The dirty events of the rounds `chunk` (their indexes) in one query, then the rows
        their tables hold for their keys in one semi-join, each read into the driver's memory
        by one task (a union of the tables' scans is otherwise a task or more per table). A
        chunk of at most `LOCAL_EVENTS` events read wholly in the driver's JVM is there
        already, each held row one of its keys': no query."""
        jvm = [i for i in chunk if readable_in_jvm(rounds[i])]
        if len(jvm) == len(chunk) and sum(rounds[i].report.events for i in chunk) <= LOCAL_EVENTS:
            events, held = in_jvm(jvm)
            return events, winners.positions(_union(held), at=True) if held else None
        built = [frames(i, rounds[i]) for i in chunk if i not in jvm] + ([in_jvm(jvm)] if jvm else [])
        events = _union([e for e, _ in built]).coalesce(1).localCheckpoint(eager=True)
        held = [h for _, hs in built for h in hs]
        if not held:
            return events, None
        wanted = events.select("_key")
        rows = _union(held).join(wanted.distinct() if many else F.broadcast(wanted), "_key", "left_semi")
        return events, winners.positions(rows, at=True).coalesce(1).localCheckpoint(eager=True)

    # the rounds in `READ_CHUNKS` chunks read at once: Spark plans a query's scans (each
    # table's manifests read) one after the other in the driver, and the chunks' in parallel
    n = min(READ_CHUNKS, len(rounds))
    with ThreadPoolExecutor(n, thread_name_prefix="cdclake-frames") as pool:
        parts = list(pool.map(read, [list(range(k, len(rounds), n)) for k in range(n)]))
    candidates = _union([e for e, _ in parts])
    held_rows = [h for _, h in parts if h is not None]
    if held_rows:
        candidates = candidates.unionByName(_union(held_rows), allowMissingColumns=True)
    # the newest change per key with the rows the key held, then per table its keys and stale
    # events, its changes' counts, signatures and held keys, and their bytes per stream
    ranked, tasks = dedupe.rank(candidates, ordering), spark.sparkContext.defaultParallelism
    found = dedupe.latest_per_key(ranked, held=True).withColumn("_table", _table()).coalesce(tasks)
    found = found.localCheckpoint(eager=True)
    changes = dedupe.resolve(found, None, ordering)
    upsert = F.col("_action") == "upsert"
    per_table = [  # in one query: a job each cost more (docs/performance.md)
        found.groupBy("_table").agg(F.count(F.lit(1)).alias("_keys"), F.sum("_stale").alias("_stale")),
        changes.groupBy("_table").agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(upsert.cast("int")).alias("up"),
            F.collect_set(F.when(upsert, F.col("_after_types"))).alias("signatures"),
            *[writes.held_keys(c).alias(c) for c, _ in dedupe.HELD_COLUMNS],
        ),
        writes.bytes_rows(changes, None, broadcast=True, by=("_table",), carried=True),
    ]
    by_table = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), per_table).collect()
    keys = {r["_table"]: (r["_keys"], r["_stale"] or 0) for r in by_table if r["_keys"] is not None}
    stale = sum(s for _, s in keys.values())
    counts = {r["_table"]: r for r in by_table if r["n"] is not None}
    delta = writes.bytes_by([r for r in by_table if r["_t"] is not None], ("_table",))
    reasons: dict[int, dict[str, int]] = {}
    stale_parts = None
    if stale:
        rows = writes.stale_rows([ranked], rounds[0].now).withColumn("_table", _table()).localCheckpoint(eager=True)
        for i, reason, n in rows.groupBy("_table", "reason").count().collect():
            reasons.setdefault(i, {})[reason] = n
        stale_parts = compat_spark.in_parts(_own_keys(rows), "_table")
    # held in the driver's JVM: each round's writes take their part with no Spark job
    changes_parts = compat_spark.in_parts(_own_keys(changes), "_table")
    shares = {}
    for i, r in enumerate(rounds):  # no Spark job from here: a failure above leaves every round as it was
        c = counts.get(i)
        r.signatures = c["signatures"] if c else []
        r.report.upserts, r.report.truncated = (c["up"] or 0) if c else 0, 0
        r.report.deletes = (c["n"] if c else 0) - r.report.upserts
        r.report.keys = keys.get(i, (0, 0))[0]
        r.delta = delta.get((i,), {})
        for name, (column, _) in zip((r.names.state, r.names.tombstones), dedupe.HELD_COLUMNS):
            named = [k.split("/", 1)[1] for k in (c[column] if c else [])]
            r.held_keys[name] = named if len(named) <= HELD_KEYS_MAX else None
        shares[id(r)] = Share(changes_parts, stale_parts, i, reasons.get(i, {}))
    log.info(
        "shared read of %d tables' rounds (%s events) took %.2f s",
        len(rounds),
        f"{sum(r.report.events for r in rounds):,}",
        time.monotonic() - started,
    )
    return shares


def compact_tables(
    spark: SparkSession,
    catalog: Catalog,
    due: list[tuple[TableNames, CompactionPolicy]],
    now: datetime,
    force: bool,
    wait: float,
    workers: int,
    on_table: Callable[[str], None] | None = None,
) -> tuple[list[CompactionReport], list[tuple[str, BaseException]]]:
    """The rounds of the `due` tables, each holding its table's lease: planned one after the
    other, the small ones read together, then each finished, `workers` at a time, in a Spark
    session of its own (`iceberg.spark.round_session`). Returns the reports and, per table
    whose round failed, what it raised (the others' rounds go on; a failed shared read leaves
    each of its rounds to read alone)."""
    from iceberg.spark import round_session

    own = workers > 1
    conf = spark.conf.getAll  # read once for the pass's sessions (each setting a call to the JVM)
    failures: dict[str, BaseException] = {}

    def begin(names: TableNames, policy: CompactionPolicy) -> tuple[Round, bool]:
        if on_table:
            on_table(names.state)
        lease = leases.acquire(catalog, names.state, "compaction", wait)
        try:
            with round_session(spark, own, conf) as session:
                r = Round(session, catalog, names, policy, now, lease)
                r.begin(force)
                return r, shareable(r)
        except BaseException:
            lease.release()
            raise

    def finish(r: Round, share: Share | None) -> CompactionReport:
        try:
            with round_session(spark, own, conf, small=share is not None) as session:
                r.spark = session
                if share is not None:
                    share.give(r, session)
                else:
                    r.read()
                return r.finish()
        finally:
            assert r.step.lease is not None
            r.step.lease.release()

    started = time.monotonic()
    planned: list[tuple[Round, bool]] = []
    shares: dict[int, Share] = {}
    finishing: dict[int, Future[CompactionReport]] = {}  # by the round's id
    reports = []
    with releasing_checkpoints(spark), ThreadPoolExecutor(workers, thread_name_prefix="cdclake-round") as pool:
        try:
            for names, policy in due:  # one after the other: the plans are Python (pyiceberg), threads slow them
                try:
                    planned.append(begin(names, policy))
                except Exception as e:  # noqa: BLE001 - reported with its table after the pass
                    failures[names.state] = e
            times = [time.monotonic() - started]
            for ordering in sorted({r.policy.ordering for r, ok in planned if ok}):
                group = [r for r, ok in planned if ok and r.policy.ordering == ordering]
                if len(group) == 1 and not readable_in_jvm(group[0]):
                    continue  # alone, a state the JVM read cannot take (too large, no position text): its own read
                for start in range(0, len(group), GROUP_TABLES):
                    chunk = group[start : start + GROUP_TABLES]
                    try:
                        small = sum(r.report.events for r in chunk) <= COMPILED_EVENTS
                        with round_session(spark, own, conf, small=small) as session:
                            shares |= read_together(session, chunk)
                    except Exception as e:  # noqa: BLE001 - each of its rounds reads alone, and fails alone
                        why = f"{type(e).__name__}: {e}"
                        log.warning("shared read of %d rounds failed (%s): each reads alone", len(chunk), why)
            times.append(time.monotonic() - started - sum(times))
            for r, _ in planned:
                finishing[id(r)] = pool.submit(finish, r, shares.get(id(r)))
            for r, _ in planned:
                try:
                    reports.append(finishing[id(r)].result())
                except Exception as e:  # noqa: BLE001 - reported with its table after the pass
                    failures[r.names.state] = e
        except BaseException:  # interrupted: no planned round keeps its table's lease
            for r, _ in planned:  # one whose finish started releases its own (the rest never start)
                if id(r) not in finishing or finishing[id(r)].cancel():
                    assert r.step.lease is not None
                    r.step.lease.release()
            raise
    times.append(time.monotonic() - started - sum(times))
    log.info("pass of %d rounds: planned in %.2f s, read together in %.2f s, finished in %.2f s", len(due), *times)
    return reports, [(n.state, failures[n.state]) for n, _ in due if n.state in failures]

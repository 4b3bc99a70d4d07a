"""Candidates and winners of a round (DataFrame -> DataFrame): the dirty events and held rows
as candidates, the newest per key by the packed route (hash aggregation) or the general
route (the window), and the winners' after-images read back from the log."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, Row
from pyspark.sql import functions as F

from connector.core.ordering import Ordering, Truncate
from iceberg import compat_spark
from iceberg.columns import once_per_context
from iceberg.compaction import dedupe
from iceberg.layouts import POSITION_TEXT, meta_names

BROADCAST_WINNERS = 2_000_000  # winner ids (~50 bytes each) sent to every task to fetch their payload

# The log's wide columns: read back for the winners only, so the sort and the shuffle of a
# round carry narrow rows whatever the payload width.
_PAYLOAD = ("after", "after_types")
_EVENT_ID = ["_topic", "_partition_id", "_sequence_number"]
# log column names of the candidate columns that are not just the name without its underscore
_LOG_NAMES = {"_partition_id": "partition", "_source_ts": "source_ts_ms"}
# What the packed route orders candidates by (the only columns it reads of every dirty event).
ORDER_COLUMNS = ["_key", "_partition_id", "_sequence_number", "_snapshot", "_source_position", "_held"]


def log_candidates(dirty: DataFrame, payload: bool = False, key: Column | None = None) -> DataFrame:
    """The dirty events as candidates; without `payload`, `_after` and `_after_types` null
    until `with_payload`; `key`: their `_key`, of the event's own (`_key`; default that)."""
    events, columns = _candidate_columns(payload)
    candidates = compat_spark.select(dirty.where(events), columns)
    return candidates if key is None else candidates.withColumn("_key", key)


# The log's columns that are candidates' (log name, candidate name), the payload's last
LOG_CANDIDATES = [
    *[(_LOG_NAMES.get(c, c[1:]), c) for c in dedupe.CANDIDATE_COLUMNS if c[1:] not in (*_PAYLOAD, "held")],
    *[(c, "_" + c) for c in _PAYLOAD],
]


@once_per_context
def _candidate_columns(payload: bool) -> tuple[Column, Any]:
    """`log_candidates`' filter (no truncate) and its columns (`compat_spark.column_seq`)."""
    columns = [
        *[
            (F.col(log) if payload or log not in _PAYLOAD else F.lit(None).cast("string")).alias(c)
            for log, c in LOG_CANDIDATES
        ],
        F.lit(False).alias("_held"),
    ]
    return F.col("op") != "t", compat_spark.column_seq(columns)


def with_payload(winners: DataFrame, dirty: DataFrame, broadcast: bool) -> DataFrame:
    """Winners with the after-image of the log events that won (held winners have none)."""
    won = winners.where(~F.col("_held")).select(*_EVENT_ID)
    payload = dirty.select(
        F.col("topic").alias("_topic"),
        F.col("partition").alias("_partition_id"),
        F.col("sequence_number").alias("_sequence_number"),
        *[F.col(c).alias("_l_" + c) for c in _PAYLOAD],
    )
    payload = payload.join(F.broadcast(won) if broadcast else won, _EVENT_ID, "left_semi")
    joined = winners.join(payload, _EVENT_ID, "left")
    return joined.select(
        *[F.when(~F.col("_held"), F.col("_l" + c)).alias(c) if c[1:] in _PAYLOAD else F.col(c) for c in winners.columns]
    )


def _first(frame: DataFrame) -> Row:
    """The one row of an aggregation (a global aggregate always has one)."""
    row = frame.first()
    assert row is not None
    return row


def candidate_bounds(ordering: Ordering) -> list[Column]:
    """`dedupe.bounds_columns` over a frame of candidates (positions only under the source
    ordering): their aggregate is the frame's packing bounds."""
    pos = F.col("_source_position") if ordering == "source" else F.lit(None).cast(dedupe.POSITION_TYPE)
    return dedupe.bounds_columns(pos, F.col("_partition_id"), F.col("_sequence_number"))


def general(
    candidates: DataFrame,
    dirty: DataFrame | None,
    ordering: Ordering,
    truncates: Sequence[Truncate] = (),
    carried: bool = False,
) -> tuple[DataFrame, DataFrame, int, int]:
    """The general route: the ordering rule's window and sort (winners with their payload,
    read back from the log unless the candidates `carried` it)."""
    ranked = dedupe.rank(candidates, ordering, truncates)
    winners = dedupe.latest_per_key(ranked).localCheckpoint(eager=True)
    totals = _first(winners.agg(F.count(F.lit(1)).alias("n"), F.sum("_stale").alias("stale")))
    if not carried:
        assert dirty is not None, "the winners' payload is read from the dirty events"
        winners = with_payload(winners, dirty, broadcast=totals["n"] <= BROADCAST_WINNERS)
    return winners, ranked, totals["n"], totals["stale"] or 0


def newest(
    candidates: DataFrame,
    ordered: DataFrame,
    held_rows: DataFrame | None,
    dirty: DataFrame,
    packing: dedupe.Packing | None,
    ordering: Ordering,
    multi_topic: bool,
    partitions: list[int],
    truncates: Sequence[Truncate],
    step: Callable[[str], None],
    carried: bool = False,
) -> tuple[DataFrame, DataFrame | None, int, int]:
    """The newest candidate per key with its payload, the ranked candidates of the general
    route (for the stale-event log), the number of keys and of stale events. `ordered`: the
    candidates' `ORDER_COLUMNS` (the packed route's input); `partitions`: those of the
    round's dirty events; `truncates`: the round's (they apply in turn, so a round with one
    takes the general route); `carried`: the candidates carry their payload (the general
    route then reads no more of the log)."""
    if packing is None or truncates:
        step("general route (no packed order key for this round)")
        return general(candidates, dirty, ordering, truncates, carried)
    # the counts and each partition's first new winner come with the checkpoint's own job
    is_new, seq = ~F.col("_irregular") & ~F.col("_win_held"), F.col("_sequence_number")
    seen = Observation("cdclake_per_key")
    per_key = (
        dedupe.packed_latest(ordered, packing, ordering)
        .observe(
            seen,
            F.count(F.lit(1)).alias("n"),
            F.sum(F.col("_irregular").cast("int")).alias("irr"),
            F.sum(is_new.cast("int")).alias("new"),
            *[F.min(F.when(is_new & (F.col("_partition_id") == p), seq)).alias(f"s{p}") for p in partitions],
        )
        .localCheckpoint(eager=True)
    )
    found = seen.get
    counts = {c: found[c] or 0 for c in ("n", "irr", "new")}
    step(f"dedupe of {counts['n']:,} keys (packed order key)")
    regular = per_key.where(~F.col("_irregular"))
    # The winners' log rows, found by their packed log key (one long: a dense broadcast
    # lookup); two topics may share one, so a multi-topic round also matches the key.
    by = ["_key", "_id"] if multi_topic else ["_id"]
    new = regular.where(~F.col("_win_held")).select(*by, *(["_position"] if ordering == "source" else []))
    # Winners are mostly recent events: read only the log files at or past the first winner
    # of each partition (Iceberg prunes the rest by their sequence-number bounds).
    floors = {p: found[f"s{p}"] for p in partitions if found[f"s{p}"] is not None}
    since = " OR ".join(f"(partition = {p} AND sequence_number >= {s})" for p, s in floors.items())
    # Under the source ordering the position comes unpacked with the winner, so the read has no
    # list column and Iceberg reads it vectorized.
    from_log = [c for c in dedupe.CANDIDATE_COLUMNS if c != "_held" and (ordering == "log" or c != "_source_position")]
    log = dirty.where(f"({since}) AND op != 't'" if floors else "false").select(
        *[F.col(_LOG_NAMES.get(c, c[1:])).alias(c) for c in from_log],
        packing.log_key_col(F.col("partition"), F.col("sequence_number")).alias("_id"),
    )
    got = log.join(F.broadcast(new) if counts["new"] <= BROADCAST_WINNERS else new, by)
    if ordering == "source":
        got = got.withColumn("_source_position", F.col("_position"))
    got = got.withColumn("_held", F.lit(False))
    if multi_topic:  # two topics may hold the same (key, partition, sequence number): keep one
        got = got.dropDuplicates(["_key"])
    winners = got.select(*dedupe.CANDIDATE_COLUMNS)
    if held_rows is not None:
        kept = held_rows.join(regular.where(F.col("_win_held")).select("_key"), "_key", "left_semi")
        winners = winners.unionByName(kept.select(*dedupe.CANDIDATE_COLUMNS))
    winners = winners.withColumn(
        "_o",
        dedupe.candidate_order(ordering),
    ).withColumn("_stale", F.lit(0).cast("bigint"))
    if not counts["irr"]:
        return winners, None, counts["n"], 0
    irregular = per_key.where(F.col("_irregular")).select("_key")
    irregular = F.broadcast(irregular) if counts["irr"] <= BROADCAST_WINNERS else irregular
    settled, ranked, _, stale = general(candidates.join(irregular, "_key", "left_semi"), dirty, ordering)
    return winners.unionByName(settled), ranked, counts["n"], stale


def held(table: DataFrame, op: str | None, *, text: bool, at: bool = False, key: Column | None = None) -> DataFrame:
    """A state or tombstone table's rows (`op` 'd' for the tombstones) as candidates but for
    their source position, which `positions` gives them once they are few (after the lookup of
    a round's keys: the list is read from `_source_position_text` where the table has it,
    `text`, so that its scan reads scalar columns only and is vectorized; a table made before
    that column has not). `at`, with where each row is (`_at`: its data file and position,
    Iceberg's `_file` and `_pos`), so that a round can remove it without a MERGE
    (`writes.commit_delta`); `key`: their `_key`, of the row's own (`_key`; default that).
    `table` must be the table itself, not a frame over it (its metadata columns are the
    table's), or a frame with `_file` and `_pos` where `at` (`compat_spark.jvm_reads`)."""
    rows = compat_spark.select(table, _held_columns(op, at, text))
    return rows if key is None else rows.withColumn("_key", key)


def positions(rows: DataFrame, at: bool) -> DataFrame:
    """`held`'s rows (with `_at` where `at`) as candidates, their source position the list."""
    return compat_spark.select(rows, _position_columns(at))


# The columns of a state or tombstone table with the position's text that `held` reads
HELD_READS = [c for c in meta_names(True) if c != "_source_position"]


@once_per_context
def _held_columns(op: str | None, at: bool, text: bool) -> Any:
    """`held`'s columns (`dedupe.CANDIDATE_COLUMNS` and the position's text; `compat_spark.column_seq`)."""
    given = {
        "_op": F.lit(op) if op else F.col("_op"),
        "_after": F.lit(None).cast("string"),
        "_after_types": F.lit(None).cast("string"),
        "_held": F.lit(True),
        "_source_position": F.lit(None).cast(dedupe.POSITION_TYPE) if text else F.col("_source_position"),
    }
    columns = [given.get(c, F.col(c)).alias(c) for c in dedupe.CANDIDATE_COLUMNS]
    position = F.col(POSITION_TEXT) if text else F.lit(None).cast("string").alias(POSITION_TEXT)
    return compat_spark.column_seq([*columns, position, *([F.struct("_file", "_pos").alias("_at")] if at else [])])


@once_per_context
def _position_columns(at: bool) -> Any:
    """`positions`' columns."""
    position = F.coalesce(F.col("_source_position"), dedupe.position_from_text(F.col(POSITION_TEXT)))
    columns = [position.alias(c) if c == "_source_position" else F.col(c) for c in dedupe.CANDIDATE_COLUMNS]
    return compat_spark.column_seq([*columns, *([F.col("_at")] if at else [])])

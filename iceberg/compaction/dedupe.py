"""The dedupe transform (DataFrame -> DataFrame): the newest change per key.

Implements `connector.core.ordering` over Spark columns. Candidates are the dirty log events of
the round plus the rows already held for the same keys (state or tombstone, `_held`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from connector.core.ordering import Ordering, Truncate
from iceberg.compaction import retain

POSITION_TYPE = "array<bigint>"


def position_text(position: Column) -> Column:
    """A source position as the state's `_source_position_text` (`layouts.META_COLUMNS`): its
    elements joined by commas; null for none, "" for an empty one."""
    return F.array_join(position.cast("array<string>"), ",")


def position_from_text(text: Column) -> Column:
    """`position_text` read back: the same list."""
    return F.when(text == "", F.array().cast(POSITION_TYPE)).otherwise(F.split(text, ",").cast(POSITION_TYPE))


# Columns every candidate carries (held rows have `_after` null).
CANDIDATE_COLUMNS = [
    "_key",
    "_topic",
    "_partition_id",
    "_offset",
    "_sequence_number",
    "_enqueued_time",
    "_op",
    "_snapshot",
    "_source_ts",
    "_source_position",
    "_payload_bytes",
    "_after",
    "_after_types",
    "_held",
]
# What a key held before its round (`latest_per_key`): its row in the state, its tombstone
HELD_COLUMNS = [("_held_s", False), ("_held_t", True)]
AT_TYPE = "struct<_file: string, _pos: bigint>"  # where a held row is (`winners.held`)


def order_struct(position: Column, snapshot: Column, partition: Column, seq: Column, ordering: Ordering) -> Column:
    """The Spark twin of `connector.core.ordering.order_key`."""
    empty = F.array().cast(POSITION_TYPE)
    return F.struct(
        (empty if ordering == "log" else F.coalesce(position, empty)).alias("p"),
        F.when(snapshot, F.lit(0)).otherwise(F.lit(1)).alias("r"),
        partition.alias("part"),
        seq.alias("seq"),
    )


def candidate_order(ordering: Ordering) -> Column:
    """`order_struct` over a candidate's own columns."""
    return order_struct(
        F.col("_source_position"), F.col("_snapshot"), F.col("_partition_id"), F.col("_sequence_number"), ordering
    )


def literal_order(position: list[int] | None, snapshot: bool, partition: int, seq: int, ordering: Ordering) -> Column:
    pos = (
        F.array(*[F.lit(int(x)) for x in position]).cast(POSITION_TYPE) if position else F.lit(None).cast(POSITION_TYPE)
    )
    return order_struct(pos, F.lit(bool(snapshot)), F.lit(int(partition)), F.lit(int(seq)), ordering)


def rank(candidates: DataFrame, ordering: Ordering, truncates: Sequence[Truncate] = ()) -> DataFrame:
    """Adds `_o` (the order struct), `_stale` (the reason a new candidate is stale, or null)
    and `_won` (the candidate is its key's newest: `latest_per_key` picks among those).

    A candidate without a source position takes the highest position of the candidates
    before it in log order (held row first), so a bare tombstone resolves with its delete.
    A new candidate is stale when it is older than what its key holds when it comes: the
    held row or an earlier event of the round in that order. `truncates` (the round's, newer
    than the table's marker, oldest first) apply in turn: each candidate comes after those
    it is not older than (its `_epoch`); at each truncate a live row is gone and a tombstone
    stays, so a candidate competes only with the candidates of its own epoch and the
    tombstone the epochs before it left. The reason names what it lost to.
    """
    by_key = Window.partitionBy("_key")
    in_log_order = by_key.orderBy(F.col("_held").desc(), "_partition_id", "_sequence_number")
    upto = in_log_order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    if ordering == "source":
        # kept as the row's position, so a held bare tombstone still guards its key
        position = F.col("_source_position")
        candidates = candidates.withColumn("_source_position", F.coalesce(position, F.max(position).over(upto)))
    ranked = candidates.withColumn("_o", candidate_order(ordering))
    fact = F.struct(F.col("_o").alias("o"), F.col("_op").alias("op"), F.col("_snapshot").alias("snap"))
    epoch = reduce(Column.__add__, [(~older_than_truncate(t, ordering)).cast("int") for t in truncates], F.lit(0))
    ranked = ranked.withColumn("_epoch", epoch)
    group = ["_key", "_epoch"] if truncates else ["_key"]
    in_epoch = Window.partitionBy(*group).orderBy(F.col("_held").desc(), "_partition_id", "_sequence_number")
    prior = F.max(fact).over(in_epoch.rowsBetween(Window.unboundedPreceding, -1))
    won = F.lit(True)
    if truncates:
        # each epoch's newest, then what every epoch starts from: the newest of the epochs
        # before it where that is a delete (a truncate removed a live one)
        ranked = ranked.withColumn("_best", F.max(fact).over(Window.partitionBy(*group)))
        earlier = by_key.orderBy("_epoch").rangeBetween(Window.unboundedPreceding, -1)
        bests = F.array_sort(F.collect_set(F.struct("_epoch", "_best")).over(earlier))
        none = F.lit(None).cast(ranked.select(fact).schema[0].dataType)

        def left(held: Column, x: Column) -> Column:
            newer = F.when(held.isNull() | (x["_best"]["o"] > held["o"]), x["_best"]).otherwise(held)
            return F.when(newer["op"] == retain.DELETE_OP, newer)

        ranked = ranked.withColumn("_start", F.aggregate(bests, none, left))
        prior = F.greatest(prior, F.col("_start"))
        last = F.max_by(F.greatest("_start", "_best"), "_epoch").over(by_key)  # what the key holds at the end
        won = F.col("_o") == last["o"]
    ranked = ranked.withColumn("_before", prior).withColumn("_won", won)
    prior = F.col("_before")
    stale = ~F.col("_held") & prior.isNotNull() & (F.col("_o") < prior["o"])
    reason = (
        F.when(~stale, F.lit(None).cast("string"))
        .when(prior["op"] == retain.DELETE_OP, F.lit("older_than_tombstone"))
        .when(F.col("_snapshot") & ~prior["snap"], F.lit("snapshot_after_stream"))
        .otherwise(F.lit("older_than_state"))
    )
    return ranked.withColumn("_stale", reason).drop("_before", "_best", "_start")


def latest_per_key(ranked: DataFrame, held: bool = False) -> DataFrame:
    """One row per `_key`: its newest candidate (`_won`), with `_stale` = how many of its events
    were stale; with `held`, also the rows the key held (`HELD_COLUMNS`: the state's and the
    tombstone, each its stream and bytes, and where it is if the held rows say, `_at` of
    `winners.held`; or null)."""
    winner = F.max_by(F.struct(*[F.col(c) for c in CANDIDATE_COLUMNS], F.col("_o")), F.when(F.col("_won"), F.col("_o")))
    at = F.col("_at") if "_at" in ranked.columns else F.lit(None).cast(AT_TYPE).alias("_at")
    row = F.struct("_topic", "_partition_id", "_payload_bytes", at)
    tomb = F.col("_op") == retain.DELETE_OP
    was = [F.max_by(row, F.when(F.col("_held") & (tomb if t else ~tomb), 1)).alias(c) for c, t in HELD_COLUMNS]
    aggregates = [winner.alias("w"), F.count(F.col("_stale")).alias("_stale"), *(was if held else [])]
    return ranked.groupBy("_key").agg(*aggregates).select("w.*", "_stale", *[c for c, _ in HELD_COLUMNS if held])


def with_held(winners: DataFrame, held_rows: DataFrame, broadcast: bool = False) -> DataFrame:
    """`winners` (one row per key) with the rows their keys held among `held_rows` (a key
    holds at most one row in each table), as `latest_per_key` with `held` gives them (sent to
    every task where `broadcast`)."""
    tomb = F.col("_op") == retain.DELETE_OP
    for column, t in HELD_COLUMNS:
        row = F.struct("_topic", "_partition_id", "_payload_bytes", "_at").alias(column)
        held = held_rows.where(tomb if t else ~tomb).select("_key", row)
        winners = winners.join(F.broadcast(held) if broadcast else held, "_key", "left")
    return winners


def older_than_truncate(truncate: Truncate, ordering: Ordering) -> Column:
    """Whether a candidate is older than `truncate` (`connector.core.ordering`'s rule over
    candidate columns; `_o` must be set under the source ordering)."""
    if ordering == "log":
        same = (F.col("_topic") == F.lit(truncate.topic)) & (F.col("_partition_id") == F.lit(truncate.partition))
        return F.when(same, F.col("_sequence_number") < F.lit(truncate.sequence_number)).otherwise(
            F.unix_micros(F.col("_enqueued_time")) < F.lit(truncate.enqueued_us)
        )
    return F.col("_o") < literal_order(
        list(truncate.position) if truncate.position else None,
        truncate.snapshot,
        truncate.partition,
        truncate.sequence_number,
        ordering,
    )


def resolve(winners: DataFrame, truncate: Truncate | None, ordering: Ordering) -> DataFrame:
    """The changes to apply, `_action`: 'upsert' (a state row), 'delete' (a tombstone), or
    'truncate' (the key leaves the state; a truncate writes no tombstone).

    A held winner changes nothing, unless `truncate` is newer than it and it is live. A
    winning delete keeps its own metadata whatever truncate follows it.
    """
    if truncate is None:
        return winners.where(~F.col("_held")).withColumn("_action", retain.action(F.col("_op")))
    removed = (F.col("_op") != retain.DELETE_OP) & older_than_truncate(truncate, ordering)
    return winners.where(~F.col("_held") | removed).withColumn(
        "_action", F.when(removed, F.lit("truncate")).otherwise(retain.action(F.col("_op")))
    )


# --- The packed route: the ordering rule as one 64-bit integer per candidate -------------
#
# Sorting every candidate by key (the window of `rank`, then `latest_per_key`) is most of a
# round's time. When the round's positions, partitions and sequence numbers fit in 63 bits
# together (PostgreSQL's one-number LSN, say, with the round's sequence range), the order key
# of `connector.core.ordering` becomes one long and the newest change per key a hash aggregation
# of longs (no sort, partial aggregation before the shuffle). Keys the packed route cannot
# settle by aggregation alone (a held or snapshot row without a position, or events that may
# be older than the held row: stale events, which are counted and logged one by one) go
# through the general route; a round that does not fit goes through it whole, and so does a
# round with a stream whose changes are out of order (the planner's `monotone`): only the
# window finds which events arrived after a newer one (stale events).

MAX_POSITION = 8  # position elements the packed route compares (SQL Server positions have 7)


@dataclass(frozen=True)
class Packing:
    """Bit layout of the packed order key `(position, rank, partition, sequence number)`.

    Each position element is stored relative to the round's minimum in just enough bits;
    positions must all have one length (a shorter tuple orders before its extensions, which
    fixed fields cannot express). The sequence number is stored relative to the round's first.
    """

    position_mins: tuple[int, ...]
    position_bits: tuple[int, ...]
    max_partition: int
    seq_min: int
    seq_span: int

    @classmethod
    def of(cls, bounds: dict[str, Any]) -> Packing | None:
        """The layout for a round's bounds, or None when the round does not fit in 63 bits."""
        if bounds["part_min"] is None or bounds["part_min"] < 0:
            return None
        sizes = bounds["size_min"], bounds["size_max"]
        if sizes[0] != sizes[1] or (sizes[1] or 0) > MAX_POSITION:
            return None
        n = sizes[1] or 0
        mins = tuple(bounds[f"lo{i}"] for i in range(n))
        bits = tuple((bounds[f"hi{i}"] - lo).bit_length() for i, lo in enumerate(mins))
        packing = cls(mins, bits, bounds["part_max"], bounds["seq_min"], bounds["seq_max"] - bounds["seq_min"])
        return packing if packing.position_shift + sum(bits) <= 63 else None

    @property
    def seq_bits(self) -> int:
        return self.seq_span.bit_length()

    @property
    def rank_shift(self) -> int:
        return self.max_partition.bit_length() + self.seq_bits

    @property
    def position_shift(self) -> int:
        return self.rank_shift + 1

    def _element_shifts(self) -> list[int]:
        return [sum(self.position_bits[i + 1 :]) for i in range(len(self.position_bits))]

    def pack(self, position: tuple[int, ...], rank: int, partition: int, seq: int) -> int:
        """The Python twin of the Spark expressions below (for tests)."""
        pk = sum((p - lo) << s for p, lo, s in zip(position, self.position_mins, self._element_shifts()))
        return (pk << self.position_shift) + (rank << self.rank_shift) + self.log_key(partition, seq)

    def log_key(self, partition: int, seq: int) -> int:
        return (partition << self.seq_bits) + (seq - self.seq_min)

    # Spark expressions
    def position_key(self, position: Column) -> Column:
        pk = F.lit(0).cast("bigint")
        for i, (lo, s) in enumerate(zip(self.position_mins, self._element_shifts())):
            pk = pk + F.shiftleft(F.get(position, i) - F.lit(lo), s)
        return pk

    def position_of(self, pk: Column) -> Column:
        """The position array back from its packed key."""
        return F.array(
            *[
                F.lit(lo) + F.shiftright(pk, s).bitwiseAND(F.lit((1 << b) - 1))
                for lo, s, b in zip(self.position_mins, self._element_shifts(), self.position_bits)
            ]
        ).cast(POSITION_TYPE)

    def log_key_col(self, partition: Column, seq: Column) -> Column:
        return F.shiftleft(partition.cast("bigint"), self.seq_bits) + (seq - F.lit(self.seq_min))


def bounds_columns(position: Column, partition: Column, seq: Column) -> list[Column]:
    """Aggregates over a frame of candidates whose first row gives `Packing.of` its bounds."""
    size = F.when(position.isNotNull(), F.size(position))
    return [
        F.min(size).alias("size_min"),
        F.max(size).alias("size_max"),
        F.min(partition).alias("part_min"),
        F.max(partition).alias("part_max"),
        F.min(seq).alias("seq_min"),
        F.max(seq).alias("seq_max"),
        *[
            agg(F.get(position, i)).alias(f"{name}{i}")
            for i in range(MAX_POSITION)
            for agg, name in ((F.min, "lo"), (F.max, "hi"))
        ],
    ]


def arrow_bounds(
    position: pa.ChunkedArray | pa.Array, partition: pa.ChunkedArray | pa.Array, seq: pa.ChunkedArray | pa.Array
) -> dict[str, Any]:
    """`bounds_columns` over Arrow columns of the same rows (the planner's scan of the log)."""
    size = pc.list_value_length(position)
    out = {
        "size_min": pc.min(size).as_py(),
        "size_max": pc.max(size).as_py(),
        "part_min": pc.min(partition).as_py(),
        "part_max": pc.max(partition).as_py(),
        "seq_min": pc.min(seq).as_py(),
        "seq_max": pc.max(seq).as_py(),
    }
    longest = min(out["size_max"] or 0, MAX_POSITION)
    for i in range(MAX_POSITION):  # past the longest position, no element: None, as Spark's min and max
        out[f"lo{i}"] = out[f"hi{i}"] = None
        if i < longest:
            element = pc.list_element(position.filter(pc.greater(size, i).fill_null(False)), i)
            out[f"lo{i}"], out[f"hi{i}"] = pc.min(element).as_py(), pc.max(element).as_py()
    return out


def merge_bounds(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The bounds of two frames' union from the bounds of each (`bounds_columns` rows)."""

    def one(name: str) -> Any:
        values = [v for v in (a[name], b[name]) if v is not None]
        low = name.endswith("_min") or name.startswith("lo")
        return (min if low else max)(values) if values else None

    return {name: one(name) for name in a}


def packed_latest(candidates: DataFrame, packing: Packing, ordering: Ordering) -> DataFrame:
    """Per key, the newest candidate by the ordering rule, by hash aggregation over longs.

    Returns `_key`, `_irregular` (the key needs the general route), and for the others the
    winner: `_win_held`, `_partition_id`, `_sequence_number`, `_id` (its packed log key,
    `Packing.log_key_col`: one long per event of a topic), and under the source ordering
    `_position`, its source position (a winning position-less candidate's carried one),
    unpacked from the order key, so the winners' rows need not read the log's list column.

    Why one aggregation suffices: position-less candidates (bare tombstones) take the highest
    position before them in log order, so only the last one in log order can win (a held or
    snapshot one makes the key irregular), and it takes the key's highest position P exactly
    when it comes after the first candidate that has P (the `first` aggregate); then it wins
    when its (rank 1, partition, sequence number) beats the positioned winner's.
    """
    held, pos = F.col("_held"), F.col("_source_position")
    seq, part = F.col("_sequence_number"), F.col("_partition_id")
    rank_bit = F.when(F.col("_snapshot"), F.lit(0)).otherwise(F.lit(1)).cast("bigint")
    if ordering == "log":
        has_p, pk = F.lit(True), F.lit(0).cast("bigint")
    else:
        has_p, pk = pos.isNotNull(), packing.position_key(pos)
    ps, rs, sb = packing.position_shift, packing.rank_shift, packing.seq_bits
    log_key = packing.log_key_col(part, seq)
    order = F.when(has_p, F.shiftleft(pk, ps) + F.shiftleft(rank_bit, rs) + log_key)
    # the highest position, then the earliest in log order (held first): `first`
    backwards = packing.log_key_col(
        F.lit(packing.max_partition) - part, F.lit(2 * packing.seq_min + packing.seq_span) - seq
    )  # reversed log key
    earliest = F.when(has_p, F.shiftleft(pk, ps) + F.shiftleft(held.cast("bigint"), rs) + backwards)
    new_bare, new_positioned = ~held & ~has_p, ~held & has_p
    agg = candidates.groupBy("_key").agg(
        F.max(order).alias("o_w"),
        F.max(earliest).alias("first"),
        F.max(F.when(new_bare, log_key)).alias("bare"),
        F.min(F.when(new_bare, log_key)).alias("bare_min"),
        F.max(~has_p & (held | (rank_bit == 0))).alias("odd_bare"),
        F.max(F.when(held & has_p, order)).alias("o_h"),
        F.min(F.when(new_positioned, order)).alias("o_min"),
        F.min(F.when(~held, part)).alias("p_lo"),
        F.max(F.when(~held, part)).alias("p_hi"),
    )
    low = F.lit((1 << ps) - 1)
    log_mask = F.lit((1 << rs) - 1)
    o_w, first, bare, o_h = F.col("o_w"), F.col("first"), F.col("bare"), F.col("o_h")
    # `first` in log order: (not held, partition, sequence number), like a bare candidate's
    first_held = F.shiftright(first, rs).bitwiseAND(F.lit(1))
    first_log = (
        F.shiftleft(F.lit(1) - first_held, rs)
        + F.lit(packing.log_key(packing.max_partition, packing.seq_min + packing.seq_span))
        - first.bitwiseAND(log_mask)
    )
    bare_order = F.shiftleft(F.lit(1).cast("bigint"), rs) + bare  # rank 1, log key
    bare_wins = bare.isNotNull() & (o_w.isNull() | ((bare_order > first_log) & (bare_order > o_w.bitwiseAND(low))))
    stale_possible = o_h.isNotNull() & (
        F.coalesce(F.col("o_min") < o_h, F.lit(False))
        | F.coalesce(F.col("bare_min") < o_h.bitwiseAND(log_mask), F.lit(False))
    )
    win = F.when(bare_wins, bare).otherwise(o_w.bitwiseAND(log_mask))
    return agg.select(
        "_key",
        # new events on two partitions: which came first is not known, nor which may be stale
        (F.col("odd_bare") | stale_possible | F.coalesce(F.col("p_lo") != F.col("p_hi"), F.lit(False))).alias(
            "_irregular"
        ),
        (~bare_wins & o_h.isNotNull() & (o_h == o_w)).alias("_win_held"),
        F.shiftright(win, sb).cast("int").alias("_partition_id"),
        (win.bitwiseAND(F.lit((1 << sb) - 1)) + F.lit(packing.seq_min)).alias("_sequence_number"),
        win.alias("_id"),
        # the positioned winner's own position, or the one a bare winner carries: both are o_w's
        (
            F.when(o_w.isNotNull(), packing.position_of(F.shiftright(o_w, ps)))
            if ordering == "source"
            else F.lit(None).cast(POSITION_TYPE)
        ).alias("_position"),
    )

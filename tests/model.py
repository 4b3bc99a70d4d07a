"""A plain-Python model of the compaction contract (docs/semantics.md), for the property tests.

Written apart from the product's code: its own order keys, its own truncate rule, one key
at a time over the whole stream (no rounds), plus the stale events a given split into
rounds must report.
"""

from __future__ import annotations

from collections import defaultdict

from connector.core.records import ChangeEvent


def _order(e: ChangeEvent, position: tuple | None, ordering: str) -> tuple:
    """Newest is greatest: (position, rank, partition, sequence number); no position under log.
    A snapshot read ranks below a streamed change at the same position."""
    rank = 0 if e.snapshot else 1
    tail = (rank, e.record.partition, e.record.sequence_number)
    return tail if ordering == "log" else (tuple(position or ()), *tail)


def _carried(evs: list[ChangeEvent], start: tuple | None = None) -> list[tuple | None]:
    """Each event's position, a missing one replaced by the highest before it (from `start`)."""
    best, out = start, []
    for e in evs:
        if e.position is not None and (best is None or tuple(e.position) > best):
            best = tuple(e.position)
        out.append(tuple(e.position) if e.position is not None else best)
    return out


def _truncate_order(t: ChangeEvent, ordering: str) -> tuple:
    if ordering == "log":
        return (t.record.enqueued_time, t.record.partition, t.record.sequence_number)
    return _order(t, t.position, ordering)


def _older_than_truncate(e: ChangeEvent, position: tuple | None, t: ChangeEvent, ordering: str) -> bool:
    if ordering == "log":  # offsets of two partitions say nothing of which came first
        if (e.record.topic, e.record.partition) == (t.record.topic, t.record.partition):
            return e.record.sequence_number < t.record.sequence_number
        return e.record.enqueued_time < t.record.enqueued_time
    return _order(e, position, ordering) < _order(t, t.position, ordering)


def _changes(events: list) -> tuple[dict[str, list[ChangeEvent]], list[ChangeEvent]]:
    by_key: dict[str, list[ChangeEvent]] = defaultdict(list)
    truncates = []
    for e in events:
        if isinstance(e, ChangeEvent):
            (truncates if e.op == "t" else by_key[e.key]).append(e)
    for evs in by_key.values():
        evs.sort(key=lambda e: (e.record.partition, e.record.sequence_number))
    return by_key, truncates


def survivors(events: list, ordering: str) -> dict[str, tuple[str, ChangeEvent, tuple | None]]:
    """Per key: which table holds it ("state" or "tombstones"), the event that survives for
    it, and the source position stored with it (a bare tombstone's carried one under the
    source ordering). A key whose newest change is live and older than the newest truncate
    is in neither; a delete keeps its own tombstone whatever truncate follows it."""
    by_key, truncates = _changes(events)
    newest = max(truncates, key=lambda t: _truncate_order(t, ordering), default=None)
    out = {}
    for key, evs in by_key.items():
        positions = _carried(evs)
        winner, position = max(zip(evs, positions), key=lambda x: _order(x[0], x[1], ordering))
        if winner.op != "d" and newest is not None and _older_than_truncate(winner, position, newest, ordering):
            continue
        stored = winner.position if ordering == "log" else position
        out[key] = ("tombstones" if winner.op == "d" else "state", winner, None if stored is None else tuple(stored))
    return out


def expected_tables(events: list, ordering: str) -> tuple[dict[str, str], dict[str, str]]:
    """(state, tombstones), each key -> the offset of the event that survives for it."""
    tables: dict[str, dict[str, str]] = {"state": {}, "tombstones": {}}
    for key, (table, e, _) in survivors(events, ordering).items():
        tables[table][key] = e.record.offset
    return tables["state"], tables["tombstones"]


def stale_events(rounds: list[list], ordering: str) -> list[tuple[int, int, str]]:
    """(partition, sequence number, reason) of every event a compaction per round ignores as
    stale: older than a change of its key that came before it (what was held after the
    earlier rounds, then the round's own events by partition and sequence number). Assumes
    no event of a later round is older than an earlier round's truncate."""
    out = []
    for i, batch in enumerate(rounds):
        held = survivors([e for r in rounds[:i] for e in r], ordering)
        by_key, _ = _changes(batch)
        for key, evs in by_key.items():
            seen = [] if key not in held else [(held[key][1], held[key][2])]
            start = held[key][2] if key in held and ordering == "source" else None
            for e, p in zip(evs, _carried(evs, start)):
                if seen:
                    top, top_p = max(seen, key=lambda x: _order(x[0], x[1], ordering))
                    if _order(e, p, ordering) < _order(top, top_p, ordering):
                        reason = (
                            "older_than_tombstone"
                            if top.op == "d"
                            else "snapshot_after_stream"
                            if e.snapshot and not top.snapshot
                            else "older_than_state"
                        )
                        out.append((e.record.partition, e.record.sequence_number, reason))
                seen.append((e, p))
    return sorted(out)


def compacted_hub(lines: list[dict], cleaner_points: dict[int, int] | None = None) -> list[tuple]:
    """What a consumer of a compacted event hub reads, from kcat -J records: in each partition,
    below its cleaner point (all of it without `cleaner_points`) the last event of each key
    (one without a payload is a tombstone: kept), then every event from the point on; by
    partition and offset. As (partition, offset, key, payload)."""
    out: list[dict] = []
    for part in sorted({line["partition"] for line in lines}):
        mine = sorted((line for line in lines if line["partition"] == part), key=lambda line: line["offset"])
        point = float("inf") if cleaner_points is None else cleaner_points.get(part, 0)
        latest: dict = {}
        for line in mine:
            if line["offset"] < point:
                latest[line["key"]] = line
        out += sorted(latest.values(), key=lambda line: line["offset"])
        out += [line for line in mine if line["offset"] >= point]
    return [(line["partition"], line["offset"], line["key"], line["payload"]) for line in out]


def versions(events: list, ordering: str) -> dict[str, list[tuple[str, str]]]:
    """Per key, its history: (offset, op) of each change the ordering rule applied, in that
    order: not the stale ones (older than a change that arrived before them), and a delete
    right after a delete (its bare tombstone) folded into the first."""
    by_key, _ = _changes(events)
    out = {}
    for key, evs in by_key.items():
        kept: list[tuple[tuple, ChangeEvent]] = []
        for e, p in zip(evs, _carried(evs)):
            o = _order(e, p, ordering)
            if kept and o < max(k for k, _ in kept):
                continue
            kept.append((o, e))
        history: list[ChangeEvent] = []
        for _, e in sorted(kept, key=lambda x: x[0]):
            if not (e.op == "d" and history and history[-1].op == "d"):
                history.append(e)
        out[key] = [(e.record.offset, e.op) for e in history]
    return out

"""A plain-Python model of the compaction contract (docs/semantics.md), for the property tests.

Written apart from the product's code: its own order keys, its own truncate rule, one key
at a time over the whole stream (no rounds), each change and each truncate applied in turn,
plus the stale events a given split into rounds must report.
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


Held = tuple[ChangeEvent, tuple | None]  # a change and the source position stored with it


def _fold(
    evs: list[ChangeEvent], truncates: list[ChangeEvent], ordering: str, held: Held | None = None
) -> tuple[Held | None, list[tuple[ChangeEvent, str]]]:
    """One key's changes applied one at a time, in log order, each truncate at its place
    (after every change older than it): a change older than what the key holds is stale,
    else it is what the key holds; a truncate removes a live row and keeps a tombstone.
    `held` (what earlier rounds left) comes first among the changes after the same truncates.
    Returns what the key holds at the end and the stale changes with their reasons."""
    start = held[1] if held is not None and ordering == "source" else None
    changes = list(zip(evs, _carried(evs, start)))
    cuts = sorted(truncates, key=lambda t: _truncate_order(t, ordering))

    def after(change: Held) -> int:  # how many of the truncates come before the change
        return sum(not _older_than_truncate(change[0], change[1], t, ordering) for t in cuts)

    top, stale = None, []
    for i in range(len(cuts) + 1):
        if held is not None and after(held) == i and (top is None or _order(*held, ordering) >= _order(*top, ordering)):
            top = held
        for e, p in (c for c in changes if after(c) == i):
            if top is not None and _order(e, p, ordering) < _order(top[0], top[1], ordering):
                won = top[0]
                why = (
                    "older_than_tombstone"
                    if won.op == "d"
                    else "snapshot_after_stream"
                    if e.snapshot and not won.snapshot
                    else "older_than_state"
                )
                stale.append((e, why))
            else:
                top = (e, p)
        if i < len(cuts) and top is not None and top[0].op != "d":
            top = None
    return top, stale


def _stored(e: ChangeEvent, carried: tuple | None, ordering: str) -> tuple | None:
    """The position stored with a surviving change: its own under log, the carried one under source."""
    p = e.position if ordering == "log" else carried
    return None if p is None else tuple(p)


def survivors(events: list, ordering: str) -> dict[str, tuple[str, ChangeEvent, tuple | None]]:
    """Per key: which table holds it ("state" or "tombstones"), the event that survives for
    it, and the source position stored with it (a bare tombstone's carried one under the
    source ordering). A key a truncate emptied is in neither; a delete keeps its own
    tombstone whatever truncate follows it."""
    by_key, truncates = _changes(events)
    out = {}
    for key, evs in by_key.items():
        top, _ = _fold(evs, truncates, ordering)
        if top is not None:
            e, p = top
            out[key] = ("tombstones" if e.op == "d" else "state", e, _stored(e, p, ordering))
    return out


def expected_tables(events: list, ordering: str) -> tuple[dict[str, str], dict[str, str]]:
    """(state, tombstones), each key -> the offset of the event that survives for it."""
    tables: dict[str, dict[str, str]] = {"state": {}, "tombstones": {}}
    for key, (table, e, _) in survivors(events, ordering).items():
        tables[table][key] = e.record.offset
    return tables["state"], tables["tombstones"]


def stale_events(rounds: list[list], ordering: str) -> list[tuple[int, int, str]]:
    """(partition, sequence number, reason) of every event a compaction per round ignores as
    stale: older than what its key held when it came (after the earlier rounds, then the
    round's own events in log order and its truncates). Assumes no event of a later round
    is older than an earlier round's truncate."""
    out = []
    for i, batch in enumerate(rounds):
        held = survivors([e for r in rounds[:i] for e in r], ordering)
        by_key, truncates = _changes(batch)
        for key, evs in by_key.items():
            before = (held[key][1], held[key][2]) if key in held else None
            _, stale = _fold(evs, truncates, ordering, before)
            out += [(e.record.partition, e.record.sequence_number, why) for e, why in stale]
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

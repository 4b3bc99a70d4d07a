"""A plain-Python model of the compaction contract (DESIGN.md §3), for the property tests."""

from __future__ import annotations

from collections import defaultdict

from connector.ordering import carry_positions, order_key
from connector.records import ChangeEvent


def survivors(events: list[ChangeEvent], ordering: str) -> dict[str, tuple[str, ChangeEvent, tuple | None]]:
    """Per key: which table holds it ("state" or "tombstones"), the event that survives for
    it, and the source position stored with it (a bare tombstone's carried one under the
    source ordering; a truncate's own for the keys it removes)."""
    by_key: dict[str, list[ChangeEvent]] = defaultdict(list)
    truncates = []
    for e in events:
        (truncates if e.op == "t" else by_key[e.key]).append(e)

    def key_of(e: ChangeEvent, position) -> tuple:
        return order_key(position, e.snapshot, e.record.partition, e.record.sequence_number, ordering)

    newest_truncate = max(truncates, key=lambda t: key_of(t, t.position), default=None)
    out = {}
    for key, evs in by_key.items():
        evs.sort(key=lambda e: (e.record.partition, e.record.sequence_number))
        positions = carry_positions([e.position for e in evs])
        winner, wkey, position = max(((e, key_of(e, p), p) for e, p in zip(evs, positions)), key=lambda x: x[1])
        if ordering == "log":
            position = winner.position
        if newest_truncate is not None and wkey < key_of(newest_truncate, newest_truncate.position):
            out[key] = ("tombstones", newest_truncate, tuple(newest_truncate.position or ()) or None)
        else:
            out[key] = ("tombstones" if winner.op == "d" else "state", winner,
                        None if position is None else tuple(position))
    return out


def expected_tables(events: list[ChangeEvent], ordering: str) -> tuple[dict[str, str], dict[str, str]]:
    """(state, tombstones), each key -> the offset of the event that survives for it."""
    tables: dict[str, dict[str, str]] = {"state": {}, "tombstones": {}}
    for key, (table, e, _) in survivors(events, ordering).items():
        tables[table][key] = e.record.offset
    return tables["state"], tables["tombstones"]

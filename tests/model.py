"""A plain-Python model of the compaction contract (DESIGN.md §3), for the property tests."""

from __future__ import annotations

from collections import defaultdict

from connector.ordering import carry_positions, order_key
from connector.records import ChangeEvent


def expected_tables(events: list[ChangeEvent], ordering: str) -> tuple[dict[str, str], dict[str, str]]:
    """(state, tombstones), each key -> the offset of the event that survives for it."""
    by_key: dict[str, list[ChangeEvent]] = defaultdict(list)
    truncates = []
    for e in events:
        (truncates if e.op == "t" else by_key[e.key]).append(e)

    def key_of(e: ChangeEvent, position) -> tuple:
        return order_key(position, e.snapshot, e.record.partition, e.record.sequence_number, ordering)

    newest_truncate = max(truncates, key=lambda t: key_of(t, t.position), default=None)
    state, tombstones = {}, {}
    for key, evs in by_key.items():
        evs.sort(key=lambda e: (e.record.partition, e.record.sequence_number))
        positions = carry_positions([e.position for e in evs])
        winner, wkey = max(((e, key_of(e, p)) for e, p in zip(evs, positions)), key=lambda x: x[1])
        if newest_truncate is not None and wkey < key_of(newest_truncate, newest_truncate.position):
            tombstones[key] = newest_truncate.record.offset
        elif winner.op == "d":
            tombstones[key] = winner.record.offset
        else:
            state[key] = winner.record.offset
    return state, tombstones

"""The retain rule: what happens to the newest change of a key. One predicate, one place.

- a live change (c, u, r) keeps its row in the state table;
- a delete (op=d, a tombstone, or a key older than a truncate) keeps a tombstone until
  `expires_at` (compaction time + tombstone_retention), then the tombstone is purged.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum


class Fate(Enum):
    KEEP_ROW = "keep-row"
    KEEP_TOMBSTONE = "keep-tombstone"
    DROP = "drop"


def fate(op: str, expires_at: datetime | None, now: datetime) -> Fate:
    if op != "d":
        return Fate.KEEP_ROW
    if expires_at is None or now < expires_at:
        return Fate.KEEP_TOMBSTONE
    return Fate.DROP


# The same rule over the tombstone table, as the SQL the purge runs.
PURGE_PREDICATE = "expires_at <= TIMESTAMP '{now}'"

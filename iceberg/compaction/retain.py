"""The retain rule: what happens to the newest change of a key. One definition, one place.

- a live change (c, u, r) keeps its row in the state table;
- a delete (op=d, or a tombstone) keeps a tombstone until `expires_at` (compaction time +
  tombstone_retention), then the tombstone is purged;
- a live change older than a truncate leaves the state and keeps nothing (`dedupe.resolve`).

`action` and `purge_predicate` are the rule as the Spark column and the SQL the job runs
(the table-driven test runs its table through both).
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import Column
from pyspark.sql import functions as F

DELETE_OP = "d"


def action(op: Column) -> Column:
    """The job's change for a winner of `op`: 'delete' writes a tombstone, 'upsert' a row."""
    return F.when(op == DELETE_OP, F.lit("delete")).otherwise(F.lit("upsert"))


def purge_predicate(now: datetime) -> str:
    """The tombstones that `fate` drops at `now` (`now` in UTC), as the SQL the purge runs."""
    return f"expires_at <= TIMESTAMP '{now.strftime('%Y-%m-%d %H:%M:%S.%f')}'"

"""The log retention's trigger told from the log's commits (`retention.may_be_older`): at most
how many rows may be older than the cut-off, from the snapshot summaries alone. Each case is a
history of commits, oldest first, and the rows the walk may leave out (those of the newest
appends whose every row is not older). No Spark: the summaries are pyiceberg's own types."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pyiceberg.table.snapshots import Operation, Snapshot, Summary

from iceberg.compaction.retention import may_be_older
from iceberg.summary_keys import APPENDED

CUTOFF = datetime(2030, 1, 1, tzinfo=UTC)
US = (CUTOFF - datetime.fromtimestamp(0, UTC)) // timedelta(microseconds=1)


def append(rows: int, oldest_us: int | None) -> tuple[Operation, dict[str, str]]:
    """An ingest commit of `rows` whose oldest enqueued time is `oldest_us` (None: no record)."""
    record = APPENDED.entry({"t:0": [0, rows, rows, 10 * rows, oldest_us, oldest_us + 5]}) if oldest_us else {}
    return Operation.APPEND, {"added-records": str(rows), **record}


TRIM = (Operation.OVERWRITE, {"deleted-records": "4", "deleted-data-files": "1", "added-records": "2"})
DV_TRIM = (Operation.DELETE, {"added-delete-files": "1", "added-position-deletes": "3"})
MANIFESTS = (Operation.REPLACE, {"manifests-created": "1", "manifests-replaced": "3"})
POSITIONS = (Operation.APPEND, {})  # positions alone: no row

# (commits oldest first, how many of the log's rows the walk leaves out)
CASES = [
    ([], 0),
    ([append(5, US - 1)], 0),  # older by a microsecond
    ([append(5, US)], 5),  # at the cut-off: not older
    ([append(5, US - 1), append(3, US), POSITIONS, append(2, US + 9)], 5),
    ([append(5, US + 1), TRIM, append(3, US)], 3),  # a trim may have rewritten the files before it
    ([append(5, US + 1), DV_TRIM, append(3, US)], 3),
    ([append(5, US + 1), MANIFESTS, append(3, US)], 8),  # a manifests' rewrite changes no file
    ([append(5, US + 1), append(4, None), append(3, US)], 3),  # a commit with no record ends the walk
    ([append(5, US + 1), (Operation.OVERWRITE, {"added-records": "4"}), append(3, US)], 3),
]


class Log:
    """What the walk reads of a pyiceberg table: its current snapshot and snapshots by id,
    each a pyiceberg `Snapshot` with its parent and summary, and the summary's row total."""

    def __init__(self, commits: list[tuple[Operation, dict[str, str]]], total: int | None, first_kept: int = 0):
        self.snapshots, parent = {}, None
        for i, (op, props) in enumerate(commits, 1):
            totals = {"total-records": str(total)} if total is not None and i == len(commits) else {}
            s = Snapshot(
                snapshot_id=i,
                parent_snapshot_id=parent,
                sequence_number=i,
                timestamp_ms=i,
                manifest_list="m",
                summary=Summary(op, **props, **totals),
            )
            if i > first_kept:  # the older ones expired
                self.snapshots[i] = s
            parent = i

    def current_snapshot(self) -> Snapshot | None:
        return self.snapshots.get(max(self.snapshots, default=0))

    def snapshot_by_id(self, snapshot_id: int) -> Snapshot | None:
        return self.snapshots.get(snapshot_id)


@pytest.mark.parametrize("commits, left_out", CASES)
def test_the_rows_that_may_be_older_than_the_cutoff_by_the_log_s_commits(commits, left_out):
    assert may_be_older(Log(commits, total=100), CUTOFF) == (100 - left_out if commits else 0)


def test_the_walk_ends_where_the_history_does_and_a_summary_without_a_total_tells_nothing():
    young = [append(5, US), append(3, US), append(2, US)]
    assert may_be_older(Log(young, total=100), CUTOFF) == 90
    assert may_be_older(Log(young, total=100, first_kept=1), CUTOFF) == 95  # the first expired
    assert may_be_older(Log(young, total=None), CUTOFF) is None

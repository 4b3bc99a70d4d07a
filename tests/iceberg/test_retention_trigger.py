"""The upkeep's decisions told from metadata. The log retention's trigger from the log's
commits (`retention.may_be_older`): at most how many rows may be older than the cut-off, from
the snapshot summaries alone; each case is a history of commits, oldest first, and the rows
the walk may leave out (those of the newest appends whose every row is not older). The
tombstones' earliest expiry after a purge (`report.earliest_expiry`), from their files'
bounds and the files those do not settle, against the plain minimum of the rows. No Spark:
the summaries are pyiceberg's own types, the tables pyiceberg's in a SQLite catalog."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table.snapshots import Operation, Snapshot, Summary

from iceberg.compaction.report import earliest_expiry
from iceberg.compaction.retention import may_be_older
from iceberg.summary_keys import APPENDED, NEVER

CUTOFF = datetime(2030, 1, 1, tzinfo=UTC)
US = (CUTOFF - datetime.fromtimestamp(0, UTC)) // timedelta(microseconds=1)


def append(rows: int, oldest_us: int | None) -> tuple[Operation, dict[str, str]]:
    """An ingest commit of `rows` whose oldest enqueued time is `oldest_us` (None: no record)."""
    record = APPENDED.entry({"t:0": [0, rows, rows, 10 * rows, oldest_us, oldest_us + 5]}) if oldest_us else {}
    return Operation.APPEND, {"added-records": str(rows), **record}


TRIM = (Operation.OVERWRITE, {"deleted-records": "4", "deleted-data-files": "1", "added-records": "2"})
DV_TRIM = (Operation.DELETE, {"added-delete-files": "1", "added-position-deletes": "3"})
DVS_MERGED = (Operation.OVERWRITE, {"removed-dvs": "2"})
WHOLE_FILE_DELETE = (Operation.DELETE, {"deleted-records": "5"})
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
    ([append(5, US + 1), DVS_MERGED, append(3, US)], 3),
    ([append(5, US + 1), WHOLE_FILE_DELETE, append(3, US)], 3),
    ([append(5, US + 1), MANIFESTS, append(3, US)], 8),  # a manifests' rewrite changes no file
    ([append(5, US + 1), append(4, None), append(3, US)], 3),  # a commit with no record ends the walk
    ([append(5, US + 1), (Operation.OVERWRITE, {"added-records": "4"}), append(3, US)], 3),
]


class Log:
    """What the walk reads of a pyiceberg table: its current snapshot and its snapshots, each a
    pyiceberg `Snapshot` with its parent and summary, and the summary's row total."""

    def __init__(self, commits: list[tuple[Operation, dict[str, str]]], total: int | None, first_kept: int = 0):
        self.by_id, parent = {}, None
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
                self.by_id[i] = s
            parent = i

    def current_snapshot(self) -> Snapshot | None:
        return self.by_id.get(max(self.by_id, default=0))

    def snapshots(self) -> list[Snapshot]:
        return list(self.by_id.values())


@pytest.mark.parametrize("commits, left_out", CASES)
def test_the_rows_that_may_be_older_than_the_cutoff_by_the_log_s_commits(commits, left_out):
    assert may_be_older(Log(commits, total=100), CUTOFF) == (100 - left_out if commits else 0)


def test_the_walk_ends_where_the_history_does_and_a_summary_without_a_total_tells_nothing():
    young = [append(5, US), append(3, US), append(2, US)]
    assert may_be_older(Log(young, total=100), CUTOFF) == 90
    assert may_be_older(Log(young, total=100, first_kept=1), CUTOFF) == 95  # the first expired
    assert may_be_older(Log(young, total=None), CUTOFF) is None


H = timedelta(hours=1)
# (each file's tombstones' `expires_at`, in hours from the cut-off): a round's own file holds
# one time; a rewrite's holds several rounds'
FILES = [
    [[-2], [1], [3]],
    [[-2, -1], [-3]],  # every one expired
    [[-2, 2, 5], [3]],  # a rewritten file with one expired: read
    [[-1, 4], [0]],  # at the cut-off: expired
    [[0, 1], [2, 7]],
    [],
]


@pytest.mark.parametrize("files", FILES)
def test_the_earliest_expiry_a_purge_leaves_is_the_rows_minimum_after_the_cutoff(tmp_path, files):
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("ns")
    schema = pa.schema([pa.field("expires_at", pa.timestamp("us", "UTC"))])
    table = catalog.create_table("ns.tombstones", schema=schema)
    for hours in files:
        table.append(pa.table({"expires_at": [CUTOFF + h * H for h in hours]}, schema=schema))
    later = [CUTOFF + h * H for hours in files for h in hours if h > 0]
    assert earliest_expiry(catalog.load_table("ns.tombstones"), CUTOFF) == min(later, default=NEVER)

"""When maintenance rewrites a table and which snapshots it expires (pure, no Spark)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from iceberg.maintenance import MaintenancePolicy, TableShape, expire_before, rewrite_due, rewrite_file_bytes

MB = 1 << 20
POLICY = MaintenancePolicy(snapshot_retention=timedelta(hours=1), rewrite_files=16, expire_batch=3)
HOUR = 3_600_000
NOW = 100 * HOUR


@pytest.mark.parametrize(
    "shape, due",
    [
        (TableShape(), False),  # no snapshot yet
        (TableShape(data_files=16, data_bytes=40 * MB, records=1000), False),  # 15 more than 40 MB need
        (TableShape(data_files=17, data_bytes=40 * MB, records=1000), True),
        # a big table's files are not all "small": 1 GB in files of at least 48 MB (3/4 of the
        # 64 MB target, which bin-pack leaves alone) is up to 22 of them
        (TableShape(data_files=37, data_bytes=1024 * MB, records=1000, target_file_bytes=64 * MB), False),
        (TableShape(data_files=38, data_bytes=1024 * MB, records=1000, target_file_bytes=64 * MB), True),
        (TableShape(data_files=1, delete_files=1, data_bytes=MB, records=10**6, deleted_rows=199_999), False),
        (TableShape(data_files=1, delete_files=1, data_bytes=MB, records=10**6, deleted_rows=200_000), True),
        # a small table's deleted rows cost readers little: its count of files bounds it
        (TableShape(data_files=2, delete_files=1, data_bytes=MB, records=1000, deleted_rows=900), False),
        (TableShape(data_files=1, delete_files=1, data_bytes=MB, records=400_000, deleted_rows=99_999), False),
        (TableShape(data_files=1, delete_files=1, data_bytes=MB, records=400_000, deleted_rows=100_000), True),
    ],
)
def test_rewrite_when_files_exceed_what_the_bytes_need_or_a_fifth_and_many_rows_are_deleted(shape, due):
    assert rewrite_due(shape, POLICY) is due


@pytest.mark.parametrize(
    "shape, cores, target",
    [
        # 1M rows in 16 MB, a fifth deleted: 12.8 MB live, a file per core
        (TableShape(data_bytes=16 * MB, records=10**6, deleted_rows=200_000), 2, 6.4 * MB),
        (TableShape(data_bytes=16 * MB, records=10**6, deleted_rows=200_000), 8, 4 * MB),  # not below 4 MB
        (TableShape(data_bytes=16 * MB, records=10**6), 1, 16 * MB),
        (TableShape(data_bytes=10 * 1024 * MB, records=10**6), 2, 512 * MB),  # the table's own size
        (TableShape(data_bytes=1024 * MB, records=10**6, target_file_bytes=64 * MB), 4, 64 * MB),
        (TableShape(), 2, 4 * MB),
        (TableShape(data_bytes=16 * MB, records=10**6, target_file_bytes=2 * MB), 2, 2 * MB),  # never above its own
    ],
)
def test_a_rewrite_spreads_a_table_of_fewer_files_than_cores_over_the_cores(shape, cores, target):
    assert rewrite_file_bytes(shape, cores) == pytest.approx(target, abs=1)


def test_expires_once_a_batch_is_older_than_the_retention():
    old = [(NOW - 5 * HOUR + i, False) for i in range(3)]
    assert expire_before(old + [(NOW, True)], NOW, POLICY) == NOW - HOUR
    assert expire_before(old[:2] + [(NOW, True)], NOW, POLICY) is None  # fewer than the batch
    young = [(NOW - HOUR + 1 + i, False) for i in range(5)]  # within the retention: kept
    assert expire_before(young + [(NOW, True)], NOW, POLICY) is None


def test_never_expires_the_newest_snapshot_with_the_cleaner_points():
    """Rewrites after the last round carry no cleaner points: the round's snapshot stays."""
    marked = NOW - 3 * HOUR
    snapshots = [
        (marked - 3, True),
        (marked - 2, False),
        (marked - 1, True),
        (marked, True),
        (marked + 1, False),
        (marked + 2, False),
    ]
    cutoff = expire_before(snapshots, NOW, POLICY)
    assert cutoff == marked
    assert [s for s in snapshots if s[0] >= cutoff] == snapshots[3:]


def test_retention_zero_keeps_only_from_the_newest_marked_snapshot():
    p = MaintenancePolicy(snapshot_retention=timedelta(0), expire_batch=1)
    assert expire_before([(1, True), (2, True)], 3, p) == 2
    assert expire_before([(1, False), (2, False)], 3, p) == 2  # no marker (tombstones): all but the newest
    assert expire_before([(2, True)], 3, p) is None


def test_a_failed_maintenance_is_reported_and_does_not_fail_the_round(settings, caplog):
    """The round before it is committed; the next round tries again (no Spark is reached here)."""
    from iceberg.catalog import load_catalog
    from iceberg.maintenance import Upkeep, maintain

    gone = f"{settings.catalog.namespace}.nothing_here"
    done = maintain(None, load_catalog(settings), settings.catalog.name, [Upkeep(gone)], POLICY)
    assert done == [f"failed {gone}: NoSuchTableError"]
    assert f"maintenance of {gone} failed" in caplog.text and "tried again after the next round" in caplog.text

"""Maintenance of a source table's Iceberg tables after its compaction round.

Every round MERGEs into the state and tombstone tables (merge-on-read): new and updated
rows go to new small data files, deleted rows to position-delete files that each later
read applies, and every commit adds a snapshot. Left alone, the files and snapshots grow
with the number of rounds (40 rounds of 10k events into a 1M-key state left 43 data files
and 42 delete files in the state, and its MERGE went from 1.7 to 2.5 s). So, after a
round, per table:

- **rewrite** when it holds `rewrite_files` more data files than its bytes need at its
  target file size, or a fifth of its rows (and at least `DELETED_ROWS_MIN`) are deleted:
  Iceberg's `rewrite_data_files`
  (bin-pack: small files joined, files with many deleted rows rewritten without them),
  then `rewrite_position_delete_files` drops the delete files that refer to no live row.
  The log and dead letters only get their manifests rewritten (`rewrite_manifests`) once
  they have more than `rewrite_files`: each ingest commit adds one, and the planner reads
  them all every round;
- **expire** its snapshots older than `snapshot_retention` (time travel reaches that far
  back), with the files only they refer to (`expire_snapshots`), once `expire_batch` of
  them are due. Never the newest snapshot carrying the table's marker
  (`summary_keys.MARKERS`: the cleaner points; the ingest positions, in the log): a
  rewrite's own snapshot has none, and they are read from the newest ancestor that has them;
- **remove orphan files** with each expiry: files in the table's location that no snapshot
  refers to and older than `orphan_age` (Iceberg's `remove_orphan_files`): what a failed or
  killed write left (Parquet, manifests, metadata JSON). The age keeps a write in progress
  (its files exist before its commit) safe, so it must exceed the longest write.

  Its own listing (Hadoop's FileSystem) has no `abfs://`: on Azure it lists with
  `ADLSFileIO`'s prefix listing (ADLS Gen2's DFS API), and where that API is missing
  (Blob storage without a hierarchical namespace; Azurite) with pyiceberg's FileIO
  (adlfs, the Blob API), whose list it hands to Iceberg (`file_list_view`).

The decisions are pure (`rewrite_due`, `expire_before`); `maintain` runs them on Spark.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from iceberg.catalog import forget, reload

if TYPE_CHECKING:
    from typing import Any

    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

    from iceberg.summary_keys import SummaryKey

log = logging.getLogger(__name__)

DELETED_RATIO = 0.2  # deleted rows over rows in data files that make a rewrite due
# fewer deleted rows than this make no rewrite due: readers apply them at little cost, and a
# small table rewritten after each round would pay two Spark jobs a round for it (its count of
# files still bounds it)
DELETED_ROWS_MIN = 100_000
TARGET_FILE_BYTES = 512 << 20  # Iceberg's default `write.target-file-size-bytes`
SMALL = 0.75  # bin-pack rewrites files below this share of the target size (its `min-file-size-bytes`)
MIN_REWRITE_FILE_BYTES = 4 << 20  # the smallest file a rewrite spreads a table over the cores in


@dataclass(frozen=True)
class MaintenancePolicy:
    snapshot_retention: timedelta = timedelta(hours=1)
    rewrite_files: int = 16
    expire_batch: int = 8
    enabled: bool = True
    orphan_age: timedelta = timedelta(hours=24)


@dataclass(frozen=True)
class TableShape:
    """What a table's current snapshot summary says of its files."""

    data_files: int = 0
    delete_files: int = 0
    data_bytes: int = 0
    records: int = 0
    deleted_rows: int = 0
    target_file_bytes: int = TARGET_FILE_BYTES


def rewrite_due(shape: TableShape, policy: MaintenancePolicy) -> bool:
    """Whether the rewrite has work: at least `rewrite_files` more files than the table's bytes
    make at bin-pack's smallest size it leaves alone means at least that many files it
    joins; the deleted share is handed to it as its `delete-ratio-threshold`."""
    needed = max(1, -(-shape.data_bytes // int(SMALL * shape.target_file_bytes)))
    return shape.data_files - needed >= policy.rewrite_files or (
        shape.deleted_rows >= max(DELETED_RATIO * shape.records, DELETED_ROWS_MIN)
    )


def rewrite_file_bytes(shape: TableShape, cores: int) -> int:
    """The rewrite's target file size: the table's, or, for a table whose live rows make fewer
    files of it than there are `cores`, those bytes over the cores, down to
    `MIN_REWRITE_FILE_BYTES`. Bin-pack reads about a target size a task and a Parquet file in
    one, so such a table (1M state rows of a 20k changes/s stream: 16 MB) would be rewritten
    by one task, and read in one after it, while the other cores idle."""
    live = shape.data_bytes * (shape.records - shape.deleted_rows) // max(shape.records, 1)
    return min(shape.target_file_bytes, max(-(-live // max(cores, 1)), MIN_REWRITE_FILE_BYTES))


def expire_before(snapshots: list[tuple[int, bool]], now_ms: int, policy: MaintenancePolicy) -> int | None:
    """The `older_than` (ms) to expire at, or None when fewer than `expire_batch` snapshots
    are due. `snapshots`: (timestamp ms, carries the cleaner points) of the table's snapshots;
    the newest one carrying them (or, where none does, the newest) is never due."""
    keep = [ts for ts, carries in snapshots if carries] or [ts for ts, _ in snapshots]  # and all after it
    cutoff = min(now_ms - int(policy.snapshot_retention.total_seconds() * 1000), max(keep, default=now_ms))
    due = sum(1 for ts, _ in snapshots if ts < cutoff)
    return cutoff if due >= policy.expire_batch else None


def shape_of(table: Table) -> TableShape:
    snapshot = table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return TableShape()
    p = snapshot.summary.additional_properties

    def number(k: str) -> int:
        return int(p.get(k, 0))

    return TableShape(
        number("total-data-files"),
        number("total-delete-files"),
        number("total-files-size"),
        number("total-records"),
        number("total-position-deletes"),
        int(table.properties.get("write.target-file-size-bytes", TARGET_FILE_BYTES)),
    )


def sql_literal(text: str) -> str:
    """`text` as a Spark SQL string literal (a backslash escapes; every other character stands)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class Upkeep:
    """A table to maintain. `marker`: the summary key whose newest snapshot expiry keeps, so
    that it and the carried keys written with it stay reachable (`summary_keys.MARKERS`; None:
    none). `append_only`: the log and dead letters, which ingest appends to (maybe at the same
    time, from another process; its commits retry on a conflict): only their manifests are
    rewritten, one per commit otherwise, which every scan plan reads."""

    name: str
    marker: SummaryKey[Any] | None = None
    append_only: bool = False


def maintain(
    spark: SparkSession, catalog: Catalog, catalog_name: str, tables: list[Upkeep], policy: MaintenancePolicy
) -> list[str]:
    """Rewrites and expires what is due in `tables`; returns what it did, e.g.
    ["rewrite ns.t", "rewrite manifests ns.t__log", "expire ns.t (12)"]."""
    if not policy.enabled:
        return []
    done = []
    call = f"CALL `{catalog_name.replace('`', '``')}`.system."
    for t in tables:
        try:
            done += _maintain_one(spark, catalog, call, t, policy)
        except Exception as e:  # the round is committed; maintenance is tried again after the next one
            log.warning(
                "maintenance of %s failed (%s: %s); the round's changes are committed, and maintenance is "
                "tried again after the next round (`[maintenance] enabled = false` turns it off)",
                t.name,
                type(e).__name__,
                str(e).splitlines()[0] if str(e) else "",
            )
            done.append(f"failed {t.name}: {type(e).__name__}")
    if done:
        log.info("maintenance: %s", ", ".join(done))
    return done


def rewrite_pending(table: Table, t: Upkeep, policy: MaintenancePolicy) -> bool:
    """Whether `table`'s files (the log's and dead letters' manifests) are due a rewrite."""
    if t.append_only:
        current = table.current_snapshot()
        return current is not None and len(current.manifests(table.io)) > policy.rewrite_files
    return rewrite_due(shape_of(table), policy)


def _snapshots(table: Table, t: Upkeep) -> list[tuple[int, bool]]:
    return [(s.timestamp_ms, t.marker is not None and t.marker.held_by(s)) for s in table.snapshots()]


def expiry_pending(table: Table, t: Upkeep, policy: MaintenancePolicy) -> int | None:
    """The cut-off (ms) before which `table`'s snapshots are due to expire, or None."""
    now_ms = int(datetime.now(UTC).timestamp() * 1000)  # snapshots carry wall-clock times
    return expire_before(_snapshots(table, t), now_ms, policy)


def maintenance_due(catalog: Catalog, tables: list[Upkeep], policy: MaintenancePolicy) -> bool:
    """Whether `maintain` would do anything, from the tables' metadata (no Spark)."""
    if not policy.enabled:
        return False
    for t in tables:
        table = catalog.load_table(t.name)
        if rewrite_pending(table, t, policy) or expiry_pending(table, t, policy) is not None:
            return True
    return False


def _maintain_one(spark: SparkSession, catalog: Catalog, call: str, t: Upkeep, policy: MaintenancePolicy) -> list[str]:
    done = []
    name = t.name
    table = catalog.load_table(name)
    if t.append_only:
        if rewrite_pending(table, t, policy):
            spark.sql(f"{call}rewrite_manifests(table => {sql_literal(name)})")
            done.append(f"rewrite manifests {name}")
            table = reload(catalog, name)
    elif rewrite_pending(table, t, policy):
        target = rewrite_file_bytes(shape_of(table), spark.sparkContext.defaultParallelism)
        spark.sql(
            f"{call}rewrite_data_files(table => {sql_literal(name)}, options => map('min-input-files', '2', "
            f"'delete-ratio-threshold', '{DELETED_RATIO}', 'target-file-size-bytes', '{target}'))"
        )
        if table.format_version < 3:  # a format-3 table's deletes are deletion vectors, kept one per file
            options = "map('rewrite-all', 'true')"
            spark.sql(f"{call}rewrite_position_delete_files(table => {sql_literal(name)}, options => {options})")
        done.append(f"rewrite {name}")
        table = reload(catalog, name)
    snapshots = _snapshots(table, t)
    cutoff = expiry_pending(table, t, policy)
    if cutoff is not None:
        when = datetime.fromtimestamp(cutoff / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
        spark.sql(
            f"{call}expire_snapshots(table => {sql_literal(name)}, older_than => TIMESTAMP '{when}', retain_last => 1)"
        )
        done.append(f"expire {name} ({sum(1 for ts, _ in snapshots if ts < cutoff)})")
        forget(catalog, name)
        removed = remove_orphans(spark, call, table, name, datetime.now(UTC) - policy.orphan_age)
        if removed:
            done.append(f"remove orphan files {name} ({removed})")
    return done


def remove_orphans(spark: SparkSession, call: str, table: Table, name: str, older: datetime) -> int:
    """Iceberg's `remove_orphan_files` of the files older than `older`; returns how many went
    (on Azure, listed as the module docstring says)."""
    when = older.strftime("%Y-%m-%d %H:%M:%S.%f")
    base = f"{call}remove_orphan_files(table => {sql_literal(name)}, older_than => TIMESTAMP '{when}'"
    from iceberg.azure import on_azure

    if not on_azure(table.location()):
        return spark.sql(base + ")").count()
    try:
        return spark.sql(base + ", prefix_listing => true)").count()
    except Exception as e:  # noqa: BLE001 - only a missing DFS API is answered here
        if "DataLakeStorageException" not in str(e):
            raise
        log.info("%s: no DFS API to list its files (%s); listing them through the Blob API", name, str(e)[:200])
    view = "cdclake_files"  # the round's own session
    spark.createDataFrame(listed_files(table), "file_path string, last_modified timestamp").createOrReplaceTempView(
        view
    )
    try:
        return spark.sql(base + f", file_list_view => '{view}')").count()
    finally:
        spark.catalog.dropTempView(view)


def listed_files(table: Table) -> list[tuple[str, datetime]]:
    """Every file under the table's location on Azure, with its last-modified time, listed
    through pyiceberg's FileIO (adlfs: the Blob API), named as the table names its files."""
    from urllib.parse import urlparse

    from pyiceberg.io.fsspec import FsspecFileIO

    url = urlparse(table.location())
    if not isinstance(table.io, FsspecFileIO):
        raise TypeError(f"table {table.name()}: listing its files needs pyiceberg's FsspecFileIO (adlfs)")
    fs = table.io.get_fs(url.scheme, url.hostname)
    found = fs.find(f"{url.username}{url.path}", detail=True)
    return [
        (f"{url.scheme}://{url.username}@{url.hostname}/{path.split('/', 1)[1]}", info["last_modified"])
        for path, info in found.items()
        if info.get("type") == "file"
    ]

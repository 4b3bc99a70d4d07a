"""The log and dead-letter tables an ingest run writes, and its fenced commits.

One writer per table: each commit is conditional on the table's `main` being where the run
read its positions. The batch's snapshot is built on the metadata the run holds, and its
commit asserts `main` is still there (pyiceberg's append asserts its branch's head; its own
retry on top of a newer `main` is off for these commits: `compat.without_retries`), one
catalog write per table and batch. A commit in between that moved the positions (another
ingest) stops the run with `ConcurrentWriterError` naming the other writer; one that did
not (maintenance) is retried on top of it.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.table import Table

from connector.core.errors import ConcurrentWriterError
from connector.core.faults import crash_point
from iceberg import compat
from iceberg.layouts import DEAD_LETTER_SCHEMA, DEAD_LETTERS_SUFFIX, LOG_SCHEMA, LOG_SUFFIX
from iceberg.leases import Lease
from iceberg.log_writer import FileTarget, append_with_positions, commit_data_files, committed_positions, upgrade
from iceberg.summary_keys import POSITIONS, WRITER

log = logging.getLogger(__name__)

COMMIT_ATTEMPTS = 8  # commits that did not move the positions (maintenance) retried over


class Sinks:
    """The log and dead-letter tables of a namespace, created on first use, and the positions
    each has committed; every commit fenced (the module's docstring)."""

    def __init__(self, catalog: Catalog, namespace: str, lease: Lease | None = None):
        self.catalog, self.namespace, self.lease = catalog, namespace, lease
        self.tables: dict[str, Table] = {}
        self.positions: dict[str, dict[str, int]] = {}
        self.writer = f"ingest on {socket.gethostname()} pid {os.getpid()}"
        self._base: str | None = None  # where the namespace's tables go (`location`)
        names = [name for _, name in catalog.list_tables(namespace) if name.endswith((LOG_SUFFIX, DEAD_LETTERS_SUFFIX))]
        at_once([functools.partial(self._load, name) for name in names])

    def _load(self, name: str) -> Table:
        table = upgrade(self.catalog.load_table((self.namespace, name)), _layout(name))
        if table.current_snapshot() is None:  # a first snapshot, so every commit is conditional on one
            try:
                _append(table, self._props(None), "main", crash_tag="ingest.first-snapshot")
            except CommitFailedException:
                pass  # another process gave it one
            table = self.catalog.load_table((self.namespace, name))
        self.tables[name], self.positions[name] = table, committed_positions(table)
        return table

    def get(self, name: str) -> Table:
        """The table `name`, loaded, or created where the catalog had no row for it when the run
        listed the namespace (or loaded it since): another process may have made it since, and
        then the creation fails and the table is loaded."""
        if name in self.tables:
            return self.tables[name]
        crash_point("ingest.create-table")
        try:  # created with its first snapshot, so every commit is conditional on one: one catalog write
            identifier, layout = (self.namespace, name), _layout(name)
            with self.catalog.create_table_transaction(identifier, layout, self.location(name)) as tx:
                compat.append_data_files(tx, [], self._props(None), "main")  # no Arrow to check
            log.info("created table %s.%s", self.namespace, name)
        except (TableAlreadyExistsError, CommitFailedException):
            pass  # another process created it first
        return self._load(name)

    def resume_positions(self, streams: Iterable[str] = ()) -> dict[str, int]:
        """Per stream, the lowest next-position of any table (0 if a table lacks it)."""
        known = set(streams).union(*[p.keys() for p in self.positions.values()])
        return {s: min((p.get(s, 0) for p in self.positions.values()), default=0) for s in known}

    def idle_seconds(self, name: str) -> float:
        """Seconds since the table's newest commit (by its writer's clock)."""
        snapshot = self.tables[name].current_snapshot()
        return time.time() - snapshot.timestamp_ms / 1000 if snapshot is not None else float("inf")

    def _merged(self, name: str, positions: Mapping[str, int]) -> dict[str, int]:
        held = self.positions[name]
        return {s: max(held.get(s, 0), positions.get(s, 0)) for s in held.keys() | positions.keys()}

    def _props(self, positions: Mapping[str, int] | None) -> dict[str, str]:
        return {**(POSITIONS.entry(dict(positions)) if positions is not None else {}), **WRITER.entry(self.writer)}

    def targets(self) -> dict[str, FileTarget]:
        """What a Spark task needs to write data files of each known table."""
        return {name: FileTarget.of(table) for name, table in self.tables.items()}

    def location(self, name: str) -> str:
        """Where table `name` of the namespace goes (every table is created with it): under the
        namespace's `location`, else `<warehouse>/<namespace>/<name>`, as pyiceberg's SQL
        catalog places a table created without one. The namespace's properties are read at the
        first call, and again at each batch's `new_target`, not once per table."""
        if self._base is None:
            base = self.catalog.load_namespace_properties(self.namespace).get("location")
            if base:
                self._base = f"{base.rstrip('/')}/"
            else:
                warehouse = self.catalog.properties.get("warehouse")
                if not warehouse:
                    raise ValueError("No default path is set, please specify a location when creating a table")
                self._base = f"{warehouse.rstrip('/')}/{self.namespace}/"
        return self._base + name

    def new_target(self) -> Callable[[str], FileTarget]:
        """What a Spark task needs to write data files of a table not created yet (by name)."""
        self._base = None
        base = self.location("")
        return functools.partial(_new_target, load_file_io(self.catalog.properties, base), base)

    def append(
        self, name: str, written: list[bytes], positions: Mapping[str, int], record: Mapping[str, str] | None = None
    ) -> None:
        """Commit data files a stage wrote (`connector.stage`, described) with `positions`
        (merged with what the table holds) and `record` in the same snapshot."""

        def write(table: Table, props: Mapping[str, str]) -> None:
            with _as_conflict():
                commit_data_files(table, written, {**props, **(record or {})}, "main")

        self._commit(name, positions, write)

    def record(self, name: str, positions: Mapping[str, int]) -> None:
        """Commit `positions` (merged with what the table holds) without rows."""

        def write(table: Table, props: Mapping[str, str]) -> None:
            _append(table, props, "main")

        self._commit(name, positions, write)

    def _commit(
        self, name: str, positions: Mapping[str, int], write: Callable[[Table, Mapping[str, str]], None]
    ) -> None:
        """`write` a snapshot with `positions` (merged with what the table holds) on the table
        as the run read it; the commit fails if `main` moved meanwhile (the module docstring)."""
        for _ in range(COMMIT_ATTEMPTS):
            if self.lease is not None:  # stop before committing if the lease was taken over
                self.lease.renew()
            table = compat.without_retries(self.tables[name])
            try:
                write(table, self._props(self._merged(name, positions)))
            except CommitFailedException:  # another commit came in between
                self._moved(name)
                continue
            crash_point("ingest.after-commit")
            self.tables[name], self.positions[name] = table, committed_positions(table)
            return
        raise ConcurrentWriterError(
            f"table {self.namespace}.{name}: other commits came in between each of {COMMIT_ATTEMPTS} attempts "
            "to commit a batch; nothing of it was committed. Rerun: it resumes where the tables are"
        )

    def _moved(self, name: str) -> None:
        """After a conflicting commit: reload the table; stop if its positions moved."""
        held = self.positions[name]
        self._load(name)
        if self.positions[name] != held:
            self.conflict(name)

    def conflict(self, name: str) -> None:
        """Stop: another writer moved the table's positions past what this run read."""
        other = WRITER.read(self.tables[name], with_key=POSITIONS) or "another writer"
        raise ConcurrentWriterError(
            f"table {self.namespace}.{name}: {other} committed positions while this ingest was writing; "
            "nothing of this batch was committed to it and this run stops. Run one ingest per table at a "
            "time; a rerun resumes where the tables are"
        )


@contextmanager
def _as_conflict() -> Iterator[None]:
    """A commit whose conflict is always `CommitFailedException`: pyiceberg raises a plain
    ValueError for a snapshot built on metadata that another commit (of any branch) moved on."""
    try:
        yield
    except ValueError as e:
        if not compat.is_stale_snapshot(e):
            raise
        raise CommitFailedException(str(e)) from e


def _append(table: Table, props: Mapping[str, str], branch: str, **kw: Any) -> None:
    """A commit without rows (by pyiceberg), a conflict always as `CommitFailedException`."""
    with _as_conflict():
        append_with_positions(table, table.schema().as_arrow().empty_table(), None, props, branch=branch, **kw)


def _new_target(io: FileIO, base: str, name: str) -> FileTarget:
    return FileTarget.new(io, base + name, _layout(name))


def _layout(name: str) -> pa.Schema:
    return LOG_SCHEMA if name.endswith(LOG_SUFFIX) else DEAD_LETTER_SCHEMA


COMMIT_THREADS = 8  # tables committed at once: each commit waits on the catalog and the store, not the CPU


def at_once(commits: Sequence[Callable[[], object]]) -> None:
    """Runs `commits` (each of another table: a commit, a creation) `COMMIT_THREADS` at a
    time; after all have ended, raises the first one's error, in the list's order."""
    if len(commits) <= 1:
        for commit in commits:
            commit()
        return
    with ThreadPoolExecutor(min(COMMIT_THREADS, len(commits)), thread_name_prefix="cdclake-commit") as pool:
        futures = [pool.submit(commit) for commit in commits]
    for future in futures:
        future.result()

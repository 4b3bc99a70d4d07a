"""Leases: at most one holder of a role per table at a time (`compaction`; `ingest`, per
namespace and source), enforced by a SQL database (SQLite or PostgreSQL): the SQL
catalog's own, or the one a REST catalog is given (`catalog.lease_engine`, the reason in
`iceberg.catalog`).

A lease is a row keyed by (catalog, table, role) in `cdclake_leases`; taking a held lease
fails on the key. A lease lasts `ttl` seconds and its holder renews it as it works; one
whose time ran out, or whose holder was a process on this host that is gone, is free.
A holder that finds its lease taken over (it stalled past the time) stops before it
commits.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import time
import uuid
import weakref
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from pyiceberg.catalog import Catalog
from sqlalchemy import BigInteger, Column, Engine, MetaData, String, Table, and_, delete, insert, select, update
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from connector.core.errors import ConnectorError

_META = MetaData()
LEASES = Table(
    "cdclake_leases",
    _META,
    Column("catalog_name", String(255), primary_key=True),
    Column("table_name", String(255), primary_key=True),
    Column("role", String(32), primary_key=True),
    Column("holder", String(255), nullable=False),
    Column("expires_ms", BigInteger, nullable=False),
)
TTL_SECONDS = 600.0
# A renewal within this share of the lease's time after the last one leaves the lease as it is:
# it has most of its time left, so no other process can have taken it over (a round renews
# before each of its steps, and each renewal is a write to the database)
RENEW_AFTER = 0.1
_MADE: weakref.WeakSet[Engine] = weakref.WeakSet()  # the databases whose leases table this process made sure of
_HOLDER = re.compile(r" on (?P<host>\S+) pid (?P<pid>\d+) ")


class LeaseHeldError(ConnectorError):
    """Another process holds the lease (the message names the table and the holder)."""


class LeaseLostError(ConnectorError):
    """The lease ran out and another process took it: this one stops before committing."""


def _engine(catalog: Catalog) -> Engine:
    """The database of `catalog`'s leases (`lease_engine`; a plain SqlCatalog's own)."""
    engine = getattr(catalog, "lease_engine", None) or getattr(catalog, "engine", None)
    if engine is None:
        raise TypeError(f"catalog {catalog.name}: no database for its leases")
    return cast(Engine, engine)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _gone(holder: str) -> bool:
    """Whether `holder` was a process on this host that no longer runs."""
    m = _HOLDER.search(holder)
    if not m or m["host"] != socket.gethostname():
        return False
    try:
        os.kill(int(m["pid"]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@dataclass
class Lease:
    catalog: Catalog
    table: str
    role: str
    holder: str
    ttl: float
    what: str = ""
    renewed: float = field(default_factory=time.monotonic)  # when it was last set to last `ttl` (monotonic)

    def _key(self) -> Any:
        return and_(
            LEASES.c.catalog_name == self.catalog.name, LEASES.c.table_name == self.table, LEASES.c.role == self.role
        )

    def renew(self) -> None:
        """Extend the lease; `LeaseLostError` if another process holds it now. Within
        `RENEW_AFTER` of its time since the last renewal, it is still this process's: nothing
        to do."""
        started = time.monotonic()
        if started - self.renewed < self.ttl * RENEW_AFTER:
            return
        with _engine(self.catalog).begin() as conn:
            done = conn.execute(
                update(LEASES)
                .where(self._key(), LEASES.c.holder == self.holder)
                .values(expires_ms=_now_ms() + int(self.ttl * 1000))
            ).rowcount
        if not done:
            raise LeaseLostError(
                f"{self.what or 'table ' + self.table}: the {self.role} lease of this process ran out and "
                "another process took it; "
                "this process stops without committing. Rerun it once the other is done"
            )
        self.renewed = started

    def release(self) -> None:
        with _engine(self.catalog).begin() as conn:
            conn.execute(delete(LEASES).where(self._key(), LEASES.c.holder == self.holder))


def acquire(
    catalog: Catalog, table: str, role: str, wait: float = 0.0, ttl: float = TTL_SECONDS, what: str | None = None
) -> Lease:
    """The lease of `role` on `table` (`what` it covers, in errors: default `table <table>`),
    waiting up to `wait` seconds for its holder to finish; `LeaseHeldError` naming the holder
    if it does not. `table` is cut to fit the key (with a digest of the rest)."""
    if len(table) > 255:
        table = table[:230] + "#" + hashlib.sha256(table.encode()).hexdigest()[:24]
    what = what or f"table {table}"
    engine = _engine(catalog)
    if engine not in _MADE:
        try:
            _META.create_all(engine, checkfirst=True)
        except (OperationalError, ProgrammingError):
            pass  # created by another process meanwhile
        _MADE.add(engine)
    since = datetime.now(UTC).isoformat(timespec="seconds")
    lease = Lease(
        catalog,
        table,
        role,
        f"{role} on {socket.gethostname()} pid {os.getpid()} since {since} ({uuid.uuid4().hex[:8]})",
        ttl,
        what,
    )
    deadline = time.monotonic() + wait
    while True:
        try:  # one transaction: a lease that ran out goes, and this one is taken where none is held
            lease.renewed = time.monotonic()
            with engine.begin() as conn:
                conn.execute(delete(LEASES).where(lease._key(), LEASES.c.expires_ms < _now_ms()))
                conn.execute(
                    insert(LEASES).values(
                        catalog_name=catalog.name,
                        table_name=table,
                        role=role,
                        holder=lease.holder,
                        expires_ms=_now_ms() + int(ttl * 1000),
                    )
                )
            return lease
        except IntegrityError:
            pass
        with engine.begin() as conn:
            row = conn.execute(select(LEASES.c.holder, LEASES.c.expires_ms).where(lease._key())).first()
        if row is None:
            continue  # released meanwhile
        if _gone(row.holder):
            with engine.begin() as conn:
                conn.execute(delete(LEASES).where(lease._key(), LEASES.c.holder == row.holder))
            continue
        if time.monotonic() >= deadline:
            until = datetime.fromtimestamp(row.expires_ms / 1000, UTC).isoformat(timespec="seconds")
            raise LeaseHeldError(
                f"{what}: {row.holder} is running (its lease lasts until {until} unless renewed); "
                f"this {role} stops. Run one {role} of it at a time, or pass --wait SECONDS to wait for it"
            )
        time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))

"""Leases on the catalog's own database (the run's SQLite catalog): one holder per table and
role, taken over only when it ran out or its process is gone."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from iceberg.catalog import load_catalog
from iceberg.leases import LEASES, RENEW_AFTER, LeaseHeldError, LeaseLostError, acquire


def test_a_held_lease_stops_a_second_holder_with_one_line_naming_the_table_and_the_holder(settings):
    catalog = load_catalog(settings)
    first = acquire(catalog, "ns.orders", "compaction")
    with pytest.raises(LeaseHeldError) as e:
        acquire(load_catalog(settings), "ns.orders", "compaction")
    line = str(e.value)
    assert line.count("\n") == 0 and "table ns.orders" in line and first.holder in line and "--wait" in line
    other = acquire(catalog, "ns.customers", "compaction")  # another table: its own lease
    first.release()
    acquire(catalog, "ns.orders", "compaction").release()
    other.release()


def test_wait_takes_the_lease_once_its_holder_releases_it(settings):
    catalog = load_catalog(settings)
    first = acquire(catalog, "ns.orders", "compaction")
    threading.Timer(0.5, first.release).start()
    started = time.monotonic()
    second = acquire(load_catalog(settings), "ns.orders", "compaction", wait=30)
    assert 0.4 < time.monotonic() - started < 10
    second.release()


def test_a_lease_that_ran_out_is_taken_over_and_its_old_holder_cannot_renew_it(settings):
    catalog = load_catalog(settings)
    stalled = acquire(catalog, "ns.orders", "compaction", ttl=0.2)
    time.sleep(0.3)
    taker = acquire(load_catalog(settings), "ns.orders", "compaction")
    with pytest.raises(LeaseLostError, match="table ns.orders"):
        stalled.renew()
    taker.renew()
    taker.release()


def test_a_renewal_soon_after_the_last_leaves_the_lease_and_a_later_one_extends_it(settings):
    catalog = load_catalog(settings)
    lease = acquire(catalog, "ns.orders", "compaction", ttl=2.0)

    def expires() -> int:
        with catalog.engine.begin() as conn:
            return conn.execute(LEASES.select().where(LEASES.c.holder == lease.holder)).one().expires_ms

    first = expires()
    time.sleep(0.05)
    lease.renew()  # well within its time: not written
    assert expires() == first
    time.sleep(2.0 * RENEW_AFTER)
    lease.renew()
    assert expires() >= first + 2.0 * RENEW_AFTER * 1000
    lease.release()


def test_the_lease_of_a_process_that_is_gone_is_free(settings):
    catalog = load_catalog(settings)
    held = acquire(catalog, "ns.orders", "compaction")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = held.holder.replace(f"pid {__import__('os').getpid()} ", f"pid {gone.stdout.strip()} ")
    with catalog.engine.begin() as conn:
        conn.execute(LEASES.update().where(LEASES.c.holder == held.holder).values(holder=dead))
    acquire(load_catalog(settings), "ns.orders", "compaction").release()  # at once, without waiting out the lease


OPEN_AT = """
import sys, time
from connector.core.config import load_settings
from iceberg.catalog import load_catalog
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
load_catalog(load_settings(work_dir=sys.argv[1]))
"""


@pytest.mark.parametrize("attempt", range(3))
def test_processes_opening_a_new_catalog_at_once_all_open_it(tmp_path, attempt):
    """Two writers started together on a fresh work directory (the catalog's tables and the
    namespace not made yet) both start: the one that loses the race to make them finds them."""
    start = time.time() + 3
    procs = [
        subprocess.Popen([sys.executable, "-c", OPEN_AT, str(tmp_path / "w"), str(start)], stderr=subprocess.PIPE)
        for _ in range(6)
    ]
    errors = [p.communicate(timeout=60)[1].decode()[-400:] for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, errors

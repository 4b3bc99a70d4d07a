"""A small, realistic Debezium stream for the demo: three tables, two connectors.

`inventory.customers` (PostgreSQL, schemas.enable=false): snapshot, inserts, updates, a
delete + tombstone, a primary-key change (delete + tombstone of the old key, create of
the new key) and a late stale replay of an old update (it must not win).
`inventory.orders` (MySQL, schemas.enable=true with Debezium Date and Decimal types):
snapshot, inserts, updates, a delete + tombstone, and an incremental-snapshot row older
than a streamed change (it must not win).
`inventory.products` (SQL Server): creates, an update, then an undecodable record (goes
to the dead letters). The two stale events come last, after a first compaction.

`demo` (the `cdclake demo` command) writes the stream, ingests and compacts it in two rounds
and shows the tables.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import typer
from rich.text import Text

from connector.commands import guard, settings_of, show_compaction, show_ingest
from connector.report import console, print_query, print_quotas, print_status

Row = dict[str, Any]  # a Debezium envelope or an image of a row

T0 = 1_763_700_000_000  # ms


def _envelope(
    op: str, before: Row | None, after: Row | None, ts: int, connector: str, snapshot: str, **source: Any
) -> Row:
    """A Debezium 2.7 change event of the demo's `shop` database; `source`: the connector's own fields."""
    name = {"postgresql": "pg", "mysql": "my", "sqlserver": "ms"}[connector]
    common = {"version": "2.7.3.Final", "connector": connector, "name": name, "ts_ms": ts, "snapshot": snapshot}
    return {
        "before": before,
        "after": after,
        "op": op,
        "ts_ms": ts,
        "transaction": None,
        "source": {**common, "db": "shop", **source},
    }


def _pg(op: str, before: Row | None, after: Row | None, lsn: int, ts: int, snapshot: str = "false") -> Row:
    return _envelope(
        op,
        before,
        after,
        ts,
        "postgresql",
        snapshot,
        sequence=json.dumps([None, str(lsn)]),
        schema="inventory",
        table="customers",
        txId=700 + lsn % 97,
        lsn=lsn,
        xmin=None,
    )


def _decimal(v: str, scale: int) -> str:
    n = int(round(float(v) * 10**scale))
    return base64.b64encode(n.to_bytes((n.bit_length() + 8) // 8 or 1, "big", signed=True)).decode()


_ORDER_FIELDS = [
    {"type": "int32", "optional": False, "field": "order_number"},
    {"type": "int32", "optional": False, "name": "io.debezium.time.Date", "version": 1, "field": "order_date"},
    {"type": "int32", "optional": False, "field": "purchaser"},
    {
        "type": "bytes",
        "optional": False,
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "field": "total",
    },
    {"type": "string", "optional": True, "field": "status"},
]
_ORDER_SCHEMA = {
    "type": "struct",
    "name": "my.shop.orders.Envelope",
    "optional": False,
    "fields": [
        {
            "type": "struct",
            "fields": _ORDER_FIELDS,
            "optional": True,
            "name": "my.shop.orders.Value",
            "field": "before",
        },
        {"type": "struct", "fields": _ORDER_FIELDS, "optional": True, "name": "my.shop.orders.Value", "field": "after"},
        {"type": "struct", "optional": False, "field": "source", "fields": []},
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
    ],
}


def _order(n: int, day: int, who: int, total: str, status: str) -> Row:
    return {"order_number": n, "order_date": day, "purchaser": who, "total": _decimal(total, 2), "status": status}


def _my(op: str, before: Row | None, after: Row | None, pos: int, ts: int, snapshot: str = "false") -> Row:
    source = {"sequence": None, "table": "orders", "server_id": 223344, "gtid": None, "file": "mysql-bin.000004"}
    payload = _envelope(op, before, after, ts, "mysql", snapshot, **source, pos=pos, row=0, thread=7, query=None)
    return {"schema": _ORDER_SCHEMA, "payload": payload}


def _ms(op: str, after: Row | None, before: Row | None, lsn: str, serial: int, ts: int) -> Row:
    return _envelope(
        op,
        before,
        after,
        ts,
        "sqlserver",
        "false",
        sequence=None,
        schema="dbo",
        table="products",
        change_lsn=lsn,
        commit_lsn=lsn,
        event_serial_no=serial,
    )


def demo_events(t0: int = T0) -> Iterator[dict[str, Any]]:
    """kcat -J style records, in topic/partition order of arrival."""
    out: list[tuple[str, int, Any, Any]] = []
    cust = "pg.inventory.customers"
    people = {
        1: ("Sally", "sally@acme.com"),
        2: ("George", "george@bailey.org"),
        3: ("Edward", "ed@walker.com"),
        4: ("Anne", "anne@kretchmar.net"),
    }
    for i, (name, mail) in people.items():
        out.append(
            (
                cust,
                i % 2,
                {"id": i},
                _pg("r", None, {"id": i, "name": name, "email": mail}, 1000, T0, "last" if i == 4 else "true"),
            )
        )
    out.append((cust, 1, {"id": 5}, _pg("c", None, {"id": 5, "name": "Pam", "email": "pam@office.com"}, 1100, T0 + 10)))
    stale = _pg("u", None, {"id": 2, "name": "George", "email": "george@old.example"}, 1150, T0 + 15)
    out.append((cust, 0, {"id": 2}, stale))
    out.append(
        (cust, 0, {"id": 2}, _pg("u", None, {"id": 2, "name": "George B.", "email": "gb@bailey.org"}, 1200, T0 + 20))
    )
    out.append((cust, 1, {"id": 3}, _pg("d", {"id": 3}, None, 1300, T0 + 30)))
    out.append((cust, 1, {"id": 3}, None))
    # primary-key change 1 -> 10: delete + tombstone of the old key, create of the new key
    out.append((cust, 1, {"id": 1}, _pg("d", {"id": 1}, None, 1400, T0 + 40)))
    out.append((cust, 1, {"id": 1}, None))
    out.append(
        (cust, 0, {"id": 10}, _pg("c", None, {"id": 10, "name": "Sally", "email": "sally@acme.com"}, 1400, T0 + 40))
    )
    late = [(cust, 0, {"id": 2}, stale)]  # late replay of an old update: stale, ignored

    orders = "my.shop.orders"
    for n in (1001, 1002, 1003):
        out.append(
            (orders, 0, {"order_number": n}, _my("r", None, _order(n, 20400, 1, "19.99", "new"), 157, T0, "true"))
        )
    out.append((orders, 0, {"order_number": 1004}, _my("c", None, _order(1004, 20410, 2, "5.00", "new"), 400, T0 + 5)))
    out.append(
        (orders, 0, {"order_number": 1001}, _my("u", None, _order(1001, 20400, 1, "24.50", "paid"), 500, T0 + 25))
    )
    out.append(
        (orders, 0, {"order_number": 1002}, _my("d", _order(1002, 20400, 1, "19.99", "new"), None, 600, T0 + 35))
    )
    out.append((orders, 0, {"order_number": 1002}, None))
    # an incremental-snapshot row read before the streamed update above: must not win
    late.append(
        (
            orders,
            0,
            {"order_number": 1001},
            _my("r", None, _order(1001, 20400, 1, "19.99", "new"), 450, T0 + 45, "incremental"),
        )
    )

    products = "ms.dbo.products"
    for i, (name, w) in enumerate([("scooter", 3.14), ("car battery", 8.1), ("hammer", 0.75)], start=101):
        out.append(
            (
                products,
                0,
                {"id": i},
                _ms("c", {"id": i, "name": name, "weight": w}, None, f"00000025:00000{i}:0002", 1, T0 + i),
            )
        )
    out.append(
        (
            products,
            0,
            {"id": 101},
            _ms("u", {"id": 101, "name": "scooter", "weight": 5.18}, None, "00000026:00000010:0002", 1, T0 + 300),
        )
    )
    out.append((products, 0, {"id": 102}, "{not json"))

    offsets: dict[tuple[str, int], int] = {}
    for topic, part, key, value in out + late:
        off = offsets.get((topic, part), 0)
        offsets[(topic, part)] = off + 1
        payload = value if isinstance(value, str) or value is None else json.dumps(value)
        yield {
            "topic": topic,
            "partition": part,
            "offset": off,
            "ts": t0 + off * 1000,  # enqueued time
            "broker": 0,
            "key": json.dumps(key),
            "payload": payload,
        }


LATE_EVENTS = 2  # the last records of the file arrive after a first compaction


def write_demo_file(path: Path, t0: int = T0) -> Path:
    """The demo's records as a kcat -J dump; `t0`: the first enqueued time (ms)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for rec in demo_events(t0):
            f.write(json.dumps(rec) + "\n")
    return path


def demo(work_dir: Path = typer.Option(Path(".cdclake/demo"), help="fresh directory for the demo's catalog")) -> None:
    """The main job on the embedded default: a Debezium stream of three tables through ingest and compaction.

    Example: `cdclake demo --work-dir /tmp/cdclake-demo`"""
    from iceberg.spark import get_spark

    started = time.monotonic()
    if work_dir.exists():
        shutil.rmtree(work_dir)
    # enqueued an hour ago: within the log retention, so the demo's log keeps every event
    events = write_demo_file(work_dir / "events.jsonl", int(time.time() * 1000) - 3_600_000)
    config = work_dir / "cdclake.toml"  # left behind: every command runs on the demo's tables with -c
    config.write_text(
        f"work_dir = {json.dumps(str(work_dir.resolve()))}\n"
        f'[source]\ntype = "file"\npath = {json.dumps(str(events.resolve()))}\n'
        "[compaction]\nmin_compaction_lag_seconds = 0\n"
    )
    settings = settings_of(config)
    total = len(events.read_text().splitlines())
    for step, (records, what) in enumerate(
        [(total - LATE_EVENTS, "the stream"), (None, f"{LATE_EVENTS} late events older than what is held")], 1
    ):
        console.rule(f"[bold]round {step}: ingest {what}, then compact[/bold]")
        guard(partial(show_ingest, settings, records))
        guard(lambda: show_compaction(settings, None, force=True, now=datetime.now(UTC)))
    console.rule("[bold]tables[/bold]")
    ns = settings.catalog.namespace
    meta = "_key AS key, _partition_id AS part, _offset AS offset, _op AS op"
    for t, columns in (
        ("customers", "_source_position AS position, name, email"),
        ("orders", "_source_position AS position, status, total"),
        ("products", "name, weight"),
    ):
        guard(partial(print_query, settings, f"SELECT {meta}, {columns} FROM {ns}.{t} ORDER BY _key", 50))
    expires = "date_format(expires_at, 'yyyy-MM-dd HH:mm') AS expires"
    guard(
        lambda: print_query(
            settings,
            f"SELECT 'customers' AS table, {meta}, {expires} FROM {ns}.customers__tombstones "
            f"UNION ALL SELECT 'orders', {meta}, {expires} FROM {ns}.orders__tombstones",
            50,
        )
    )
    dead = f"SELECT topic, partition, offset, reason, detail FROM {ns}.products__dead_letters"
    console.print(Text(dead, style="bold"), soft_wrap=True)
    for r in guard(lambda: get_spark(settings).sql(dead).collect()):
        console.print(Text(f"{r.topic}:{r.partition} offset {r.offset}: {r.reason}: {r.detail}"), soft_wrap=True)
    console.rule("[bold]status[/bold]")
    guard(lambda: print_status(settings))
    guard(lambda: print_quotas(settings))
    console.print(f"demo finished in {time.monotonic() - started:.1f}s; catalog {settings.catalog_uri}", soft_wrap=True)
    console.print(
        f"its configuration is {config}: try `cdclake status -c {config}`, `cdclake read customers -c {config}`, "
        f'`cdclake query -c {config} "SELECT * FROM cdc.orders"`',
        soft_wrap=True,
    )

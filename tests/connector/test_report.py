"""What the CLI prints (no Spark): shares and sizes as a person reads them, and reports that
fit 80 columns without a wrapped cell."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

from connector import report
from connector.app import StreamStatus, matching
from connector.core.config import Settings
from iceberg.compaction.report import CompactionReport


@pytest.mark.parametrize(
    "part,whole,text",
    [
        (0, 10**9, "0%"),
        (416, 1024**3, "<0.01%"),
        (39, 1000, "3.9%"),
        (1, 3, "33%"),
        (997, 1000, "99%"),  # not full until it is
        (5, 5, "100%"),
        (6, 5, "120%"),
    ],
)
def test_share(part, whole, text):
    assert report.share(part, whole) == text


def test_usage_names_the_bytes_and_the_quota():
    assert report.usage_text(1208, 1024**3) == "1.18 KB of 1 GB (<0.01%)"
    assert report.usage_text(1208, None) == "1.18 KB"


def printed(monkeypatch, width: int, fn, *args) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    monkeypatch.setattr(report, "console", console)
    fn(*args)
    return console.export_text().splitlines()


def test_the_compaction_report_is_one_table_that_fits_80_columns(monkeypatch):
    busy = CompactionReport("customers_with_a_long_name", events=1_234_567, keys=45_678, upserts=40_000, deletes=5_678)
    busy.stale, busy.stale_reasons, busy.seconds = 3, {"older_than_state": 2, "snapshot_after_stream": 1}, 12.34
    busy.maintenance = ["rewrite state: 12 files -> 1"]
    quiet = CompactionReport("quiet", ran=False)
    lines = printed(monkeypatch, 80, report.print_compaction, [busy, CompactionReport("orders"), quiet])
    assert max(len(line) for line in lines) <= 80
    row = next(line for line in lines if line.startswith("customers_with_a_long_name"))
    assert row.split() == ["customers_with_a_long_name", "1,234,567", "45,678", "40,000", "5,678", "3", "12.3"]
    assert next(line for line in lines if line.startswith("orders")).split()[1:] == ["0"] * 5 + ["0.0"]
    assert "customers_with_a_long_name: stale: 2 older_than_state, 1 snapshot_after_stream" in lines
    assert "customers_with_a_long_name: maintenance: rewrite state: 12 files -> 1" in lines
    assert lines[-1] == "1 of 3 tables: nothing due" and not [line for line in lines if line.startswith("quiet")]


def test_reports_of_50_tables_show_the_20_busiest_and_sum_up_the_rest(monkeypatch):
    from types import SimpleNamespace

    events = {f"t{i:02d}": (i * 37) % 50 * 100 for i in range(50)}  # 0 ... 4,900, each once
    busiest = sorted(events, key=events.__getitem__)[-20:]
    quiet = [t for t in events if t not in busiest]
    reports = [CompactionReport(t, events=n, keys=n // 10, upserts=n // 2, deletes=1) for t, n in events.items()]
    lines = printed(monkeypatch, 80, report.print_compaction, reports)
    assert sorted(line.split()[0] for line in lines if line.startswith("t") and line[1].isdigit()) == sorted(busiest)
    rest = sum(events[t] for t in quiet)
    assert lines[-1] == (
        f"and 30 more tables: {rest:,} events, {sum(events[t] // 10 for t in quiet):,} keys, "
        f"{sum(events[t] // 2 for t in quiet):,} upserts, 30 deletes, 0 stale"
    )
    stats = SimpleNamespace(records=sum(events.values()), duplicates=0, accepted=events, dead_letters={"t00": 3})
    lines = printed(monkeypatch, 80, report.print_ingest, stats)
    shown = {line.split()[0] for line in lines if line.startswith("t") and line[1].isdigit()}
    assert "t00" not in shown and shown == set(busiest)  # t00: no record accepted, 3 dead letters
    assert lines[-1] == f"and 30 more tables: {rest:,} accepted, 3 dead letters"
    few = printed(monkeypatch, 80, report.print_ingest, SimpleNamespace(**{**vars(stats), "accepted": {"a": 1}}))
    assert [line.split() for line in few if line.startswith(("a ", "t00"))] == [["a", "1", "0"], ["t00", "0", "3"]]


def test_a_table_too_wide_for_the_console_prints_its_rows_as_lines(monkeypatch):
    table = report.table_of("key", "value", title="wide")
    table.add_row("k", "word " * 30)
    lines = printed(monkeypatch, 40, report.show, table)
    assert lines[0] == "wide" and lines[1] == "  key: k" and lines[2].startswith("  value: word word")


# A fleet: `status` and `quotas` print a line per table, that fits 80 columns, and a summary.

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
GB = 1024**3
FLEET = [f"inventory_movements_{i:03}" for i in range(150)] + [f"orders_archive_{i:03}" for i in range(150, 200)]


def stream_status(
    table: str,
    part: int,
    ratio: float = 0.1,
    lag: timedelta | None = None,
    due: bool = False,
    compaction: bool = True,
    usage: int = GB,
) -> StreamStatus:
    """One stream's status as `app.status` gives it: `lag`, the age of its oldest dirty event at NOW."""
    dirty = 0 if lag is None else 1_234_567
    return StreamStatus(
        table=table,
        stream=f"dbserver1.inventory.{table}:{part}",
        cleaner_point=9_876_543,
        dirty_events=dirty,
        dirty_bytes=usage // 10 if dirty else 0,
        clean_bytes=usage - (usage // 10 if dirty else 0),
        dirty_ratio=ratio,
        live_rows=12_345_678,
        tombstones=123_456,
        tier="standard",
        quota_bytes=250 * GB,
        log_from=0,
        first_dirty_time=None if lag is None else NOW - lag,
        due=due,
        compaction=compaction,
    )


def fleet() -> list[StreamStatus]:
    """200 tables of 4 partitions: every 10th has partition 2 due; every 8th has partition 1's
    oldest dirty event 20 minutes old (over the 15 allowed), table 3 exactly 15 minutes, table 5
    a second less; tables 7 and 77 are log only, 3 days behind; the others 30 seconds behind, or
    clean where their number is odd. Table 8's partition 3 is 75% dirty, table 9's partition 0
    holds 200 GB."""
    rows = []
    for i, name in enumerate(FLEET):
        for part in range(4):
            lag = None if i % 2 else timedelta(seconds=30)
            if i % 8 == 0 and part == 1:
                lag = timedelta(minutes=20)
            if i == 3 and part == 0:
                lag = timedelta(minutes=15)
            if i == 5 and part == 0:
                lag = timedelta(minutes=15) - timedelta(seconds=1)
            if i in (7, 77):
                lag = timedelta(days=3)
            rows.append(
                stream_status(
                    name,
                    part,
                    ratio=0.75 if (i, part) == (8, 3) else 0.1,
                    lag=lag,
                    due=i % 10 == 0 and part == 2,
                    compaction=i not in (7, 77),
                    usage=200 * GB if (i, part) == (9, 0) else GB,
                )
            )
    return rows


def test_status_of_200_tables_is_a_line_each_within_80_columns_and_a_summary(monkeypatch):
    lines = printed(monkeypatch, 80, report.show_status, fleet(), NOW, timedelta(minutes=15))
    assert max(len(line) for line in lines) <= 80
    title, header, rule, *rows, summary = lines
    assert title.startswith("status per table") and header.split() == ["table", "dirty", "ratio", "lag", "usage"]
    assert set(rule.strip()) == {"─"}
    assert [row.split()[0] for row in rows] == FLEET
    # due: tables 0, 10, ..., 190; lagging: 0, 8, ..., 192 and 3 (exactly at the limit)
    assert summary == "200 tables, 20 due, 26 lagging"
    row = {row.split()[0]: row.split()[1:] for row in rows}
    assert row["inventory_movements_008"] == ["4,938,268", "0.75", "20m", "0s", "1", "GB", "of", "250", "GB", "(0.4%)"]
    assert row["inventory_movements_001"] == ["0", "0.10", "-", "1", "GB", "of", "250", "GB", "(0.4%)"]
    assert row["inventory_movements_003"][2:4] == ["15m", "0s"]
    assert row["inventory_movements_005"][2:4] == ["14m", "59s"]
    assert row["inventory_movements_007"][2:4] == ["log", "only"]
    assert row["inventory_movements_009"][3:] == ["200", "GB", "of", "250", "GB", "(80%)"]


def test_status_per_stream_ends_with_the_same_summary(monkeypatch):
    rows = [s for s in fleet() if s.table in FLEET[:10]]
    lines = printed(monkeypatch, 400, report.show_status, rows, NOW, timedelta(minutes=15), True)
    assert lines[0].startswith("status per stream") and lines[-1] == "10 tables, 1 due, 3 lagging"
    body = lines[3:-1]
    assert len(body) == 40 and all(line.startswith("dbserver1.inventory.inventory_movements_00") for line in body)
    assert "20m 0s" in body[8 * 4 + 1] and " - " in body[1 * 4 + 1]


def test_one_table_and_a_limit_from_the_settings():
    one = [stream_status("orders", 0, lag=timedelta(minutes=2)), stream_status("orders", 1, due=True)]
    assert report.status_summary(one, NOW, timedelta(minutes=1)) == "1 table, 1 due, 1 lagging"
    assert report.status_summary(one, NOW, timedelta(minutes=15)) == "1 table, 1 due, 0 lagging"
    assert report.status_summary([], NOW, timedelta(minutes=15)) == "0 tables, 0 due, 0 lagging"
    assert report.lag_limit(Settings()) == timedelta(minutes=15)
    assert report.lag_limit(Settings(compaction={"max_compaction_lag_seconds": 90})) == timedelta(seconds=90)


@pytest.mark.parametrize(
    "seconds,text",
    [(None, "-"), (0, "0s"), (42.9, "42s"), (250, "4m 10s"), (3_600, "1h 0m"), (7_500, "2h 5m"), (273_600, "3d 4h")],
)
def test_age_text(seconds, text):
    assert report.age_text(seconds) == text


@pytest.mark.parametrize(
    "globs,expected",
    [
        (None, FLEET),
        ([], FLEET),
        (["inventory_*"], FLEET[:150]),
        (["orders_archive_19?", "inventory_movements_007"], ["inventory_movements_007"] + FLEET[190:]),
        (["*_1[0-1]0"], ["inventory_movements_100", "inventory_movements_110"]),
        (["INVENTORY_*"], []),  # case counts
        (["inventory"], []),  # a glob matches the whole name
    ],
)
def test_table_globs(globs, expected):
    assert matching(FLEET, globs) == expected


def test_quotas_of_200_tables_is_a_line_each_with_its_fullest_partition(monkeypatch):
    lines = printed(monkeypatch, 80, lambda: report.show(report.usage_table(fleet())))
    assert max(len(line) for line in lines) <= 80
    title, header, rule, *rows = lines
    assert header.split() == ["table", "tier", "parts", "usage"] and [r.split()[0] for r in rows] == FLEET
    row = {r.split()[0]: r.split()[1:] for r in rows}
    assert row["inventory_movements_009"] == ["standard", "4", "200", "GB", "of", "250", "GB", "(80%)"]
    assert row["orders_archive_199"] == ["standard", "4", "1", "GB", "of", "250", "GB", "(0.4%)"]
    lines = printed(monkeypatch, 400, lambda: report.show(report.usage_streams(fleet())))
    assert len(lines) == 3 + 800 and lines[0].startswith("usage per partition")


def test_status_as_json_carries_each_streams_oldest_dirty_event_and_lag(monkeypatch):
    import connector.app

    asked = []

    def status(settings, now, globs):
        asked.append((now, globs))
        return fleet()[:40]

    monkeypatch.setattr(connector.app, "status", status)
    lines = printed(monkeypatch, 80, report.print_status, Settings(), True, False, ["inventory_*"], NOW)
    rows = {r["stream"]: r for r in json.loads("\n".join(lines))}
    assert asked == [(NOW, ["inventory_*"])] and len(rows) == 40
    late = rows["dbserver1.inventory.inventory_movements_008:1"]
    assert late["first_dirty_time"] == "2025-06-01T11:40:00+00:00" and late["lag_seconds"] == 1200
    assert late["due"] is False and late["compaction"] is True and late["usage_bytes"] == GB
    clean = rows["dbserver1.inventory.inventory_movements_001:0"]
    assert clean["first_dirty_time"] is None and clean["lag_seconds"] is None

"""What the CLI prints (no Spark): shares and sizes as a person reads them, and reports that
fit 80 columns without a wrapped cell."""

from __future__ import annotations

import pytest
from rich.console import Console

from connector import report
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


def test_a_table_too_wide_for_the_console_prints_its_rows_as_lines(monkeypatch):
    table = report.table_of("key", "value", title="wide")
    table.add_row("k", "word " * 30)
    lines = printed(monkeypatch, 40, report.show, table)
    assert lines[0] == "wide" and lines[1] == "  key: k" and lines[2].startswith("  value: word word")

"""Faults of the environment through the CLI, on real tables: each is one line naming the
table and the file and what to do, with exit code 1; the other tables go on. The full disk
is the one fault built by hand (an `OSError` with `ENOSPC`): no disk can be filled here."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from urllib.parse import urlparse

import pytest

from connector.app import load_usage
from connector.core.failures import describe
from iceberg.catalog import load_catalog
from tests.conftest import kcat_lines
from tests.iceberg.helpers import names, run_ingest, with_source, write_lines


def _pg(op: str, key: int, lsn: int, table: str) -> str:
    after = None if op == "d" else {"id": key, "v": lsn}
    return json.dumps({"op": op, "after": after, "source": {"connector": "postgresql", "table": table, "lsn": lsn}})


def _cli(monkeypatch, s, *args: str):
    from typer.testing import CliRunner

    from connector.cli import app

    monkeypatch.setenv("CDCLAKE_WORK_DIR", str(s.work_dir))
    monkeypatch.setenv("CDCLAKE_CATALOG__NAMESPACE", s.catalog.namespace)
    monkeypatch.setenv("CDCLAKE_SOURCE__PATH", s.source.path)
    return CliRunner().invoke(app, list(args))


@pytest.mark.spark
def test_a_lost_data_file_or_damaged_metadata_is_one_line_and_other_tables_go_on(
    spark, settings, tmp_path, monkeypatch
):
    lines = []
    for table in ("alpha", "beta"):
        lines += kcat_lines(
            f"db.s.{table}", [_pg("c", k, 10 + k, table) for k in range(3)], [{"id": k} for k in range(3)]
        )
    s = with_source(settings, write_lines(tmp_path / "in.jsonl", [*lines]))
    run_ingest(s)
    assert _cli(monkeypatch, s, "compact", "--force").exit_code == 0
    catalog = load_catalog(s)
    alpha = names(s, "alpha")
    held_before = sum(r["_payload_bytes"] for r in catalog.load_table(alpha.state).scan().to_arrow().to_pylist())
    (task,) = catalog.load_table(alpha.state).scan().plan_files()
    gone = urlparse(task.file.file_path).path
    Path(gone).unlink()
    lines += kcat_lines("db.s.alpha", [_pg("u", 1, 20, "alpha")], [{"id": 1}], ts0=1_700_000_001_000)
    lines[-1] = json.dumps(json.loads(lines[-1]) | {"offset": 3})
    write_lines(tmp_path / "in.jsonl", lines)
    assert _cli(monkeypatch, s, "ingest").exit_code == 0  # ingest reads no state row

    # the round reads the state's rows for its key (its plan takes the bytes from the commits)
    result = _cli(monkeypatch, s, "compact", "--force", "--table", "alpha")
    out = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(out) == 1, result.output
    assert out[0].startswith(f"error: table {alpha.state}: its data file ") and gone in out[0], out[0]
    assert "restore the file" in out[0]
    assert _cli(monkeypatch, s, "compact", "--force", "--table", "beta").exit_code == 0  # the other table goes on

    beta = names(s, "beta")
    metadata = Path(urlparse(catalog.load_table(beta.state).metadata_location).path)
    metadata.write_text(metadata.read_text()[:100])  # cut short, as by a full disk
    result = _cli(monkeypatch, s, "compact", "--force", "--table", "beta")
    out = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(out) == 1, result.output
    assert out[0].startswith(f"error: table {beta.state}: its metadata file ") and str(metadata) in out[0], out[0]
    assert "register_table" in out[0]

    # ingest reads no state row, so neither fault stops it: quota usage is what alpha's
    # commits recorded plus its new event, and every byte of beta's log (its state unreadable)
    lines += kcat_lines("db.s.beta", [_pg("u", 1, 20, "beta")], [{"id": 1}], ts0=1_800_000_000_000)
    lines[-1] = json.dumps(json.loads(lines[-1]) | {"offset": 3})
    write_lines(tmp_path / "in.jsonl", lines)
    assert _cli(monkeypatch, s, "ingest").exit_code == 0
    logged = {t: catalog.load_table(names(s, t).log).scan().to_arrow().to_pylist() for t in ("alpha", "beta")}
    assert [len(rows) for rows in logged.values()] == [4, 4]
    usage = {t: sum(u.values()) for t, u in load_usage(s, catalog).items()}
    assert usage == {
        "alpha": held_before + next(r["payload_bytes"] for r in logged["alpha"] if r["offset"] == "3"),
        "beta": sum(r["payload_bytes"] for r in logged["beta"]),
    }


def test_a_full_disk_names_the_table_and_the_file():
    path = "/lake/warehouse/inv.db/orders__log/data/00000-1-abc.parquet"
    e = OSError(errno.ENOSPC, "No space left on device", path)
    line = describe(e)
    assert line is not None and "\n" not in line
    assert line.startswith("no space left on the device writing table inv.orders__log") and path in line


def test_an_unknown_error_is_left_to_show_its_trace():
    assert describe(ValueError("a bug")) is None

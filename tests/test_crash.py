"""Exactly-once across crashes: the CLI is killed with SIGKILL (CDCLAKE_CRASH_AT) between
writing data and committing, and right after committing; a rerun must end with the same
tables as one uninterrupted run. Input: the demo stream (three tables)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from connector.core.config import load_settings
from connector.demo import write_demo_file
from iceberg.catalog import load_catalog

NOW_MS = int(time.time() * 1000) - 3_600_000  # the demo stream, enqueued an hour ago

pytestmark = [pytest.mark.spark, pytest.mark.slow]
TABLES = ("customers", "orders", "products")


def cli(work: Path, events: Path, *args: str, crash: str | None = None, env_extra: dict | None = None) -> int:
    env = {
        **os.environ,
        **(env_extra or {}),
        "CDCLAKE_WORK_DIR": str(work),
        "CDCLAKE_SOURCE__PATH": str(events),
        "CDCLAKE_SOURCE__BATCH_SIZE": "4",
        "CDCLAKE_SPARK__SHUFFLE_PARTITIONS": "2",
    }
    env.pop("CDCLAKE_CRASH_AT", None)
    if crash:
        env["CDCLAKE_CRASH_AT"] = crash
    return subprocess.run(
        [sys.executable, "-m", "connector.cli", *args], env=env, capture_output=True, timeout=300
    ).returncode


def snapshot_of(work: Path, **catalog_settings) -> dict[str, list]:
    catalog = load_catalog(load_settings(work_dir=work, **({"catalog": catalog_settings} if catalog_settings else {})))
    out = {}
    for _, name in catalog.list_tables("cdc"):
        rows = catalog.load_table(f"cdc.{name}").scan().to_arrow().to_pylist()
        for r in rows:  # wall-clock columns differ between runs by design
            for c in ("ingested_at", "deleted_at", "expires_at"):
                r.pop(c, None)
        out[name] = sorted(rows, key=repr)
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    work = tmp_path_factory.mktemp("clean")
    events = write_demo_file(work / "events.jsonl", NOW_MS)  # inside the log retention: the log keeps all
    assert cli(work, events, "run", "--force") == 0  # ingest, then compact: one process
    return events, snapshot_of(work)


def test_ingest_crashes_then_a_rerun_equal_one_clean_run(reference, tmp_path):
    """Killed before its third commit, then (the rerun) right after its third: the run after
    both adds each record once."""
    events, expected = reference
    for crash in ("ingest.before-commit:3", "ingest.after-commit:3"):
        assert cli(tmp_path, events, "ingest", crash=crash) == -signal.SIGKILL, crash
    assert cli(tmp_path, events, "ingest") == 0
    got = snapshot_of(tmp_path)
    for t in TABLES:
        assert got[f"{t}__log"] == expected[f"{t}__log"]
    assert got["products__dead_letters"] == expected["products__dead_letters"]


def test_compaction_crashes_then_a_rerun_equal_one_clean_run(reference, tmp_path):
    """Killed between a round's tombstones and its state (a `run`, after its ingest), then (the
    rerun) right after its second commit: the pass after both leaves the clean run's tables."""
    events, expected = reference
    assert cli(tmp_path, events, "run", "--force", crash="compact.after-tombstones") == -signal.SIGKILL
    assert cli(tmp_path, events, "compact", "--force", crash="compact.after-commit:2") == -signal.SIGKILL
    assert cli(tmp_path, events, "compact", "--force") == 0
    got = snapshot_of(tmp_path)
    for t in TABLES:
        assert got[t] == expected[t], t
        assert got.get(f"{t}__tombstones") == expected.get(f"{t}__tombstones"), t


@pytest.mark.azurite
def test_a_crash_on_an_azure_warehouse_then_a_rerun_equals_one_clean_run(reference, azurite, tmp_path):
    """A round killed between its commits on a warehouse on Azurite (`abfs://`, the
    connection string from the environment), whose tables then equal the local clean run's;
    the account key reaches the job's Spark (ADLSFileIO's shared key), never its event log."""
    from azure.storage.blob import BlobServiceClient

    from tests.conftest import AZURITE_KEY

    events, expected = reference
    container = f"crash{tmp_path.name[-6:].replace('_', '-').lower()}"
    BlobServiceClient.from_connection_string(azurite).create_container(container)
    warehouse = f"abfs://{container}@devstoreaccount1.dfs.core.windows.net/cdc"
    logs = tmp_path / "spark-events"
    logs.mkdir()
    env = {
        "CDCLAKE_CATALOG__WAREHOUSE": warehouse,
        "CDCLAKE_CATALOG__AZURE__CONNECTION_STRING": azurite,
        "CDCLAKE_SPARK__CONF": f'{{"spark.eventLog.enabled": "true", "spark.eventLog.dir": "{logs.as_uri()}", '
        '"spark.eventLog.compress": "false"}',
    }
    # ingested, then killed in the round (a `run`: one process)
    assert cli(tmp_path, events, "run", "--force", crash="compact.after-tombstones", env_extra=env) == -signal.SIGKILL
    assert cli(tmp_path, events, "compact", "--force", env_extra=env) == 0
    got = snapshot_of(tmp_path, warehouse=warehouse, azure={"connection_string": azurite})
    for t in TABLES:
        for name in (t, f"{t}__tombstones", f"{t}__log"):
            assert got.get(name) == expected.get(name), name
    assert not (tmp_path / "warehouse").exists()
    text = "".join(p.read_text(errors="replace") for p in logs.rglob("*") if p.is_file())
    assert "adls.auth.shared-key.account.key" in text and AZURITE_KEY not in text

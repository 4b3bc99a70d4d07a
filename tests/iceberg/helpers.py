from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

from connector.app import policy_of, run_ingest
from connector.core.config import Settings
from connector.debezium import decoder_for
from connector.sources.file import parse_line
from iceberg.catalog import load_catalog
from iceberg.compaction.job import compact
from iceberg.compaction.stats import load_optional
from iceberg.layouts import TableNames
from iceberg.maintenance import MaintenancePolicy

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def with_source(settings: Settings, path: Path, **compaction) -> Settings:
    update = {"source": settings.source.model_copy(update={"path": str(path)})}
    if compaction:
        update["compaction"] = settings.compaction.model_copy(update=compaction)
    return settings.model_copy(update=update)


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def names(settings: Settings, table: str) -> TableNames:
    return TableNames(settings.catalog.name, settings.catalog.namespace, table)


def compact_table(
    spark,
    settings: Settings,
    table: str,
    now: datetime = NOW,
    force: bool = True,
    packed: bool = True,
    maintenance: MaintenancePolicy | None = None,
):
    policy = dataclasses.replace(policy_of(settings), packed=packed)
    if maintenance is not None:
        policy = dataclasses.replace(policy, maintenance=maintenance)
    return compact(spark, load_catalog(settings), names(settings, table), policy, now, force)


def offsets_by_key(settings: Settings, name: str) -> dict[str, str]:
    t = load_optional(load_catalog(settings), name)
    if t is None:
        return {}
    rows = t.scan(selected_fields=("_key", "_offset")).to_arrow().to_pylist()
    assert len({r["_key"] for r in rows}) == len(rows), f"duplicate keys in {name}"
    return {r["_key"]: r["_offset"] for r in rows}


def decoded(path: Path, settings: Settings):
    d = decoder_for(settings)
    return [d.decode(parse_line(json.loads(line))) for line in path.read_text().splitlines() if line.strip()]


__all__ = ["run_ingest", "NOW"]

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
from iceberg.compaction.quiet import logged_since, quota_usage
from iceberg.compaction.stats import cleaner_points, load_optional, recorded_bytes
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
    log_retention: bool = False,
):
    """One round at `now` (2030 by default: the test streams' events are years older, so log
    retention, which would trim them, is off unless asked for). `packed`: the packed route
    wherever a round fits, however small; else the general route (with the events' payload
    in a small round, as in production)."""
    policy = dataclasses.replace(policy_of(settings), packed=packed, **({"small_round": 0} if packed else {}))
    if not log_retention:
        policy = dataclasses.replace(policy, log_retention=None)
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


def assert_recorded_bytes_are_held(settings: Settings, table: str) -> None:
    """The bytes per stream the state's and the tombstones' newest commits recorded (the quota
    usage ingest reads) equal those of their rows, summed here."""
    catalog = load_catalog(settings)
    for name in (names(settings, table).state, names(settings, table).tombstones):
        t = load_optional(catalog, name)
        if t is None:
            continue
        held: dict[str, int] = {}
        for r in t.scan(selected_fields=("_topic", "_partition_id", "_payload_bytes")).to_arrow().to_pylist():
            stream = f"{r['_topic']}:{r['_partition_id']}"
            held[stream] = held.get(stream, 0) + (r["_payload_bytes"] or 0)
        recorded, rows = recorded_bytes(t), {k: v for k, v in held.items() if v}
        assert recorded == rows, f"{name}: recorded {recorded}, its rows hold {rows}"


def assert_usage_told_by_metadata(settings: Settings, table: str, compacted: bool) -> None:
    """Quota usage (`quiet.quota_usage`) equals the bytes of the rows, summed here: the log's
    past the cleaner points, the state's and the tombstones'; once a round has run
    (`compacted`), the log's part comes from the commits' metadata (`quiet.logged_since`)."""
    catalog, n = load_catalog(settings), names(settings, table)
    state, log = load_optional(catalog, n.state), catalog.load_table(n.log)
    points = cleaner_points(state)
    told = logged_since(log, state, points) if state is not None else None
    assert told is not None or not compacted, f"{table}: the commits' metadata does not tell the log's dirty bytes"
    rows: dict[str, int] = {}
    columns = ("topic", "partition", "sequence_number", "payload_bytes")
    for r in log.scan(selected_fields=columns).to_arrow().to_pylist():
        stream = f"{r['topic']}:{r['partition']}"
        if r["sequence_number"] >= points.get(stream, 0):
            rows[stream] = rows.get(stream, 0) + (r["payload_bytes"] or 0)
    for name in (n.state, n.tombstones):
        held = load_optional(catalog, name)
        for r in [] if held is None else held.scan(selected_fields=HELD).to_arrow().to_pylist():
            stream = f"{r['_topic']}:{r['_partition_id']}"
            rows[stream] = rows.get(stream, 0) + (r["_payload_bytes"] or 0)
    assert quota_usage(catalog, n) == {k: v for k, v in rows.items() if v}, table


HELD = ("_topic", "_partition_id", "_payload_bytes")


def decoded(path: Path, settings: Settings):
    d = decoder_for(settings)
    return [d.decode(parse_line(json.loads(line))) for line in path.read_text().splitlines() if line.strip()]


def pg(op: str, key: int | str, lsn: int, snapshot: str = "false") -> str:
    """A PostgreSQL connector's change of key `key` of table `things` at LSN `lsn`."""
    return json.dumps(
        {
            "op": op,
            "before": None,
            "after": None if op == "d" else {"id": key, "v": lsn},
            "source": {"connector": "postgresql", "table": "things", "lsn": lsn, "snapshot": snapshot},
        }
    )


def kline(part: int, offset: int, key: int | str | None, value: str | None, ts: int) -> str:
    """One kcat -J line on a partition of topic db.s.things."""
    return json.dumps(
        {
            "topic": "db.s.things",
            "partition": part,
            "offset": offset,
            "ts": 1_700_000_000_000 + ts,
            "key": None if key is None else json.dumps({"id": key}),
            "payload": value,
        }
    )


__all__ = ["run_ingest", "NOW"]

"""The whole pipeline on the production stores, through the CLI with a config file as a user
writes it: a PostgreSQL catalog (Debian's server, infra/postgres.py) and a warehouse on S3
(moto's server, infra/s3_server.py). Ingest in two runs, compaction with maintenance after
each, status, quotas and a query; the tables then equal the model of the stream. The stream
holds the contract's hard cases (ordering, stale events, snapshot rows, truncates, dead
letters) and a table whose tier fills up under backpressure, so each guarantee is checked on
every store these tests run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from connector.core.config import load_settings
from tests.conftest import PG_PASSWORD
from tests.iceberg.helpers import decoded, names, offsets_by_key, write_lines
from tests.iceberg.test_property import assert_matches_model, to_lines
from tests.quotas.test_quota_ingest import line

pytestmark = pytest.mark.spark
TABLE = "items"


# The contract's hard cases, one after another over 4 keys (the property test's examples):
# stale events, snapshot rows, deletes with and without their tombstone, truncates,
# re-deliveries and a record key that is not JSON (a dead letter).
HARD_CASES = [
    (0, "c", 1, False), (1, "c", 1, False), (1, "d", 2, True), (0, "t", 1, False),
    (0, "c", 5, False), (0, "u", 3, False), (0, "u", 7, False), (1, "u", 2, False), (1, "r", 1, False),
    (2, "junk", 1, False), (0, "r", 7, False), (3, "u", 3, False), (2, "t", 1, False), (3, "r", 1, False),
    (0, "u", 3, False), (1, "d", 2, True), (0, "t", 1, False), (0, "r", 1, False), (1, "r", 1, False),
    (0, "t", 1, False), (0, "again", 1, False), (2, "c", 4, False), (3, "d", 6, False), (2, "u", 5, True),
]  # fmt: skip
FULL, FULL_EVENTS = "orders", 30  # a table on a tier that 30 updates of 2 keys overflow: backpressure


SPLIT = 12  # records the first ingest takes: the hard cases come in two rounds


def _stream(path: Path, ordering: str) -> Path:
    """`TABLE`'s hard cases, then `FULL`'s updates (the second ingest's)."""
    full = [line(0, i, i % 2, table=FULL) for i in range(FULL_EVENTS)]
    return write_lines(path, to_lines(HARD_CASES, ordering, TABLE) + full)


def _toml(value) -> str:
    return (
        json.dumps(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)
    )


def _config(tmp_path: Path, stream: Path, catalog: dict, namespace: str, ordering: str) -> Path:
    properties = catalog.pop("properties", {})
    lines = [
        f"work_dir = {json.dumps(str(tmp_path / 'work'))}",
        "[source]",
        'type = "file"',
        f"path = {json.dumps(str(stream))}",
        "batch_size = 25",
        "[catalog]",
        f'namespace = "{namespace}"',
        *[f"{k} = {_toml(v)}" for k, v in catalog.items()],
        "[catalog.properties]",
        *[f'"{k}" = "{v}"' for k, v in properties.items()],
        "[compaction]",
        f'ordering = "{ordering}"',
        "[quotas]",
        'policy = "backpressure"',
        "[quotas.custom.tiny]",
        "compacted_bytes_per_partition = 8000",
        "[maintenance]",  # every round expires and rewrites what it can, orphan files included
        "snapshot_retention_hours = 0",
        "rewrite_files = 2",
        "orphan_age_hours = 24",
        f"[tables.{TABLE}]",
        'key_fields = ["id"]',
        f"[tables.{FULL}]",
        'tier = "tiny"',
    ]
    path = tmp_path / "cdclake.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _whole_pipeline(
    spark, tmp_path: Path, catalog: dict, env: dict[str, str], monkeypatch, ordering: str = "source"
) -> object:
    """Runs every command on the stores; returns the settings (for reading the tables)."""
    from connector.cli import app

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    tmp_path.mkdir(parents=True, exist_ok=True)
    stream = _stream(tmp_path / "in.jsonl", ordering)
    config = _config(tmp_path, stream, dict(catalog), f"d{tmp_path.name[-6:].replace('-', '_')}", ordering)
    settings = load_settings(config)
    runner, out = CliRunner(), {}
    try:
        for args in (
            ["ingest", "--max-records", str(SPLIT)],
            ["compact", "--force"],
            ["ingest"],
            ["compact", "--force"],
            ["status", "--json"],
            ["quotas", "--json"],
        ):
            result = runner.invoke(app, [args[0], "-c", str(config), *args[1:]])
            assert result.exit_code == 0, (args, result.output, repr(result.exception)[:3000])
            assert "failed" not in result.output, (args, result.output)  # maintenance is best effort: logged
            out[args[0]] = out.get(args[0], "") + result.output
            if args == ["ingest"]:  # the tier filled: ingest compacted to go on
                assert offsets_by_key(settings, names(settings, FULL).state), "no backpressure round"
        assert "maintenance: rewrite" in out["compact"], out["compact"]  # maintenance ran on the store
        statuses = json.loads(out["status"])
        assert statuses and {s["table"] for s in statuses} == {TABLE, FULL}
        assert all(s["dirty_events"] == 0 for s in statuses), statuses
        events, bounds = decoded(stream, settings), [SPLIT, len(stream.read_text().splitlines())]
        assert_matches_model(settings, TABLE, events, bounds, ordering)
        assert_matches_model(settings, FULL, events, bounds, ordering)
        state = offsets_by_key(settings, names(settings, TABLE).state)
        ns = settings.catalog.namespace
        result = runner.invoke(
            app, ["query", "-c", str(config), f"SELECT count(*) AS live FROM {ns}.{TABLE} WHERE id >= 0"]
        )
        assert result.exit_code == 0 and str(len(state)) in result.output.split(), result.output
        return settings
    finally:
        spark.conf.set("spark.sql.defaultCatalog", "lake")  # the other tests' catalog


@pytest.mark.rest
@pytest.mark.slow
def test_the_whole_pipeline_on_a_rest_catalog(spark, rest_catalog, tmp_path, monkeypatch):
    """Through Iceberg's REST catalog server (pyiceberg's RestCatalog, Spark's RESTCatalog),
    the leases in a database of their own; then `read`, `verify`, `rebuild` and DuckDB."""
    from connector.cli import app
    from iceberg.duckdb_query import run

    catalog = {"name": "restlake", "type": "rest", "uri": rest_catalog.uri, "warehouse": rest_catalog.warehouse}
    settings = _whole_pipeline(spark, tmp_path, catalog, {}, monkeypatch, ordering="log")
    config, runner = tmp_path / "cdclake.toml", CliRunner()
    state = names(settings, TABLE).state
    try:
        held = offsets_by_key(settings, state)
        for command in ("read", "verify", "rebuild"):
            result = runner.invoke(app, [command, TABLE, "-c", str(config)])
            assert result.exit_code == 0, (command, result.output)
        assert offsets_by_key(settings, state) == held
    finally:
        spark.conf.set("spark.sql.defaultCatalog", "lake")
    got = {r["_key"]: r["_offset"] for r in run(settings, f"SELECT _key, _offset FROM {state}").to_pylist()}
    assert got == held
    assert settings.leases_uri.endswith("leases.db") and Path(settings.leases_uri.split("///")[1]).exists()


@pytest.mark.rest
@pytest.mark.slow
def test_a_rest_catalog_that_requires_oauth2_is_reached_with_the_credential(spark, tmp_path):
    """A REST catalog server that answers only requests bearing the token its OAuth2 endpoint
    gives the client `cdclake` (client credentials grant): pyiceberg's RestCatalog (ingest)
    and Spark's RESTCatalog (compaction) both get that token from `catalog.credential`.
    Without a credential, or with another client's, a one-line error says what to set."""
    from connector.app import run_compaction, run_ingest
    from connector.core.errors import ConnectorError
    from iceberg.catalog import load_catalog
    from tests.conftest import infra

    server = infra("rest_catalog").RestCatalogServer(tmp_path / "server")
    server.start(bearer="client-credentials-token:sub=cdclake")
    stream = write_lines(tmp_path / "in.jsonl", to_lines(HARD_CASES, "source", TABLE))
    catalog = {"name": "oauthlake", "type": "rest", "uri": server.uri, "namespace": "oauth"}
    try:
        for refused in ({}, {"credential": "intruder:s3cret"}):
            with pytest.raises(ConnectorError) as e:
                load_catalog(load_settings(work_dir=tmp_path / "work", catalog={**catalog, **refused}))
            message = str(e.value)
            assert "\n" not in message and "catalog.credential" in message and server.uri in message, message
            assert "s3cret" not in message
        settings = load_settings(
            work_dir=tmp_path / "work",
            catalog={**catalog, "credential": "cdclake:s3cret", "warehouse": server.warehouse},
            source={"type": "file", "path": str(stream)},
            tables={TABLE: {"key_fields": ["id"]}},
        )
        run_ingest(settings)
        run_compaction(settings, force=True)
        events = decoded(stream, settings)
        assert_matches_model(settings, TABLE, events, [len(events)], "source")
    finally:
        spark.conf.set("spark.sql.defaultCatalog", "lake")
        server.stop()


@pytest.mark.postgres
@pytest.mark.slow
def test_the_whole_pipeline_on_a_postgresql_catalog(spark, postgres, tmp_path, monkeypatch):
    settings = _whole_pipeline(
        spark, tmp_path, {"name": "pg", "uri": postgres.uri}, {"CDCLAKE_CATALOG__PASSWORD": PG_PASSWORD}, monkeypatch
    )
    import psycopg

    with psycopg.connect(
        host="127.0.0.1", port=postgres.port, user="cdclake", password=PG_PASSWORD, dbname="cdclake"
    ) as conn:
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM iceberg_tables WHERE catalog_name = 'pg' AND table_namespace = %s",
                (settings.catalog.namespace,),
            )
        }
        leases = conn.execute("SELECT count(*) FROM cdclake_leases").fetchone()[0]
    assert {TABLE, f"{TABLE}__log", f"{TABLE}__tombstones"} <= tables
    assert leases == 0  # the catalog's database holds the leases too, released at the end


def test_a_password_in_the_catalog_uri_is_refused_and_never_shown():
    from connector.core.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        load_settings(catalog={"uri": "postgresql+psycopg://cdclake:hunter2@127.0.0.1:5432/cdclake"})
    assert "hunter2" not in str(e.value) and "catalog.password" in str(e.value)


@pytest.mark.s3
@pytest.mark.slow
def test_the_whole_pipeline_on_an_s3_warehouse(spark, s3, tmp_path, monkeypatch):
    import boto3

    bucket_prefix = f"w{tmp_path.name[-6:]}"
    settings = _whole_pipeline(
        spark,
        tmp_path,
        {"name": "s3lake", "warehouse": f"s3://lake/{bucket_prefix}", "properties": s3.properties()},
        {},
        monkeypatch,
    )
    client = boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    keys = [
        o["Key"] for p in client.get_paginator("list_objects_v2").paginate(Bucket="lake") for o in p.get("Contents", [])
    ]
    ns = settings.catalog.namespace
    for kind in ("data", "metadata"):
        assert any(k.startswith(f"{bucket_prefix}/{ns}") and f"/{TABLE}/{kind}/" in k for k in keys), (kind, keys[:20])
    assert not (settings.root / "warehouse").exists()  # nothing on the local disk
    # DuckDB reads the S3 warehouse through httpfs with the catalog's s3.* properties
    from iceberg.duckdb_query import run

    state = names(settings, TABLE).state
    got = {r["_key"]: r["_offset"] for r in run(settings, f"SELECT _key, _offset FROM {state}").to_pylist()}
    assert got and got == offsets_by_key(settings, state)


@pytest.mark.azurite
@pytest.mark.slow
def test_the_whole_pipeline_on_an_azure_warehouse(spark, azurite, tmp_path, monkeypatch, caplog):
    """The warehouse on Azurite's Blob endpoint through `abfs://` (Iceberg's ADLSFileIO in
    Spark, adlfs in pyiceberg), the connection string from the environment; then `read`,
    `verify` and `rebuild` on it."""
    from azure.storage.blob import BlobServiceClient

    from connector.cli import app

    container = f"w{tmp_path.name[-6:].replace('_', '-').lower()}"
    blobs = BlobServiceClient.from_connection_string(azurite).create_container(container)
    warehouse = f"abfs://{container}@devstoreaccount1.dfs.core.windows.net/cdc"
    secret = {"CDCLAKE_CATALOG__AZURE__CONNECTION_STRING": azurite}
    catalog = {"name": "azlake", "warehouse": warehouse}
    settings = _whole_pipeline(spark, tmp_path, catalog, secret, monkeypatch, ordering="log")
    ns = settings.catalog.namespace
    names_found = [b.name for b in blobs.list_blobs(name_starts_with=f"cdc/{ns}/")]
    for kind in ("data", "metadata"):
        assert any(f"/{TABLE}/{kind}/" in n for n in names_found), (kind, names_found[:20])
    assert not (settings.root / "warehouse").exists()  # nothing on the local disk
    config, runner = tmp_path / "cdclake.toml", CliRunner()
    try:
        read = runner.invoke(app, ["read", TABLE, "-c", str(config)])
        assert read.exit_code == 0, read.output
        state = offsets_by_key(settings, names(settings, TABLE).state)
        assert {json.loads(line)["key"] for line in read.output.splitlines()} >= set(state)
        for command in ("verify", "rebuild"):
            result = runner.invoke(app, [command, TABLE, "-c", str(config)])
            assert result.exit_code == 0 and "Error" not in result.output, (command, result.output)
        assert offsets_by_key(settings, names(settings, TABLE).state) == state
        _orphans_on_azurite(spark, settings, blobs, caplog)
    finally:
        spark.conf.set("spark.sql.defaultCatalog", "lake")


def _orphans_on_azurite(spark, settings, blobs, caplog) -> None:
    """Azurite has no DFS API, so Iceberg's prefix listing fails there and orphan removal
    lists through the Blob API (`maintenance.listed_files`): the list names every file the
    table refers to exactly as the table does, and a file it does not (an orphan), as the
    Azure SDK lists them. Iceberg refuses an orphan age under 24 hours and Azurite cannot
    age a blob, so the removal itself runs and finds nothing old enough."""
    from datetime import UTC, datetime, timedelta

    from iceberg.catalog import load_catalog
    from iceberg.maintenance import listed_files, remove_orphans

    name = names(settings, TABLE).state
    table = load_catalog(settings).load_table(name)
    prefix = table.location().split(".net/", 1)[1]
    blobs.upload_blob(f"{prefix}/data/orphan.parquet", b"left by a killed write")
    listed = {path for path, _ in listed_files(table)}
    sdk = {
        f"{table.location().split('.net/')[0]}.net/{b.name}" for b in blobs.list_blobs(name_starts_with=prefix + "/")
    }
    referenced = set(table.inspect.all_files()["file_path"].to_pylist()) | {table.metadata_location}
    assert listed == sdk and referenced <= listed and f"{table.location()}/data/orphan.parquet" in listed
    call = f"CALL {settings.catalog.name}.system."
    with caplog.at_level("INFO", logger="iceberg.maintenance"):
        assert remove_orphans(spark, call, table, name, datetime.now(UTC) - timedelta(hours=24)) == 0
    assert "listing them through the Blob API" in caplog.text


@pytest.mark.postgres
@pytest.mark.s3
@pytest.mark.cluster
@pytest.mark.slow
def test_cdclake_run_on_a_standalone_cluster_ends_as_the_model(postgres, s3, spark_cluster, tmp_path, monkeypatch):
    """`cdclake` on the cluster (its own driver process, executors on the two workers) with
    the PostgreSQL catalog and the S3 warehouse: an ingest of the stream's first records, its
    master from the configuration, then `run` through spark-submit's `--master`; each table's
    log holds every event at most once and each key's winning event, its state and tombstones
    those of the model of the stream."""
    import os
    import subprocess
    import sys

    from iceberg.catalog import load_catalog
    from tests.model import expected_tables, survivors

    catalog = {"name": "prod", "uri": postgres.uri, "warehouse": "s3://lake/prod", "properties": s3.properties()}
    monkeypatch.setenv("CDCLAKE_CATALOG__PASSWORD", PG_PASSWORD)
    stream = _stream(tmp_path / "in.jsonl", "source")
    config = _config(tmp_path, stream, dict(catalog), f"c{tmp_path.name[-6:].replace('-', '_')}", "source")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}  # the executors reach the driver on the loopback
    root, master = Path(__file__).resolve().parents[1], spark_cluster.master_url

    def run(command: list[str], **extra: str) -> None:
        done = subprocess.run(command, env={**env, **extra}, capture_output=True, text=True, timeout=600, cwd=root)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    run([sys.executable, "-m", "connector.cli", "ingest", "-c", str(config), "--max-records", str(SPLIT)],
        CDCLAKE_SPARK__MASTER=master)  # fmt: skip
    run(["bash", str(root / "infra" / "submit.sh"), "--master", master, "--", "run", "-c", str(config), "--force"])
    apps = (Path(spark_cluster.dir) / "master.log").read_text().count("Registering app cdclake")
    assert apps == 2  # both ran on the cluster
    settings = load_settings(config)
    events = [e for e in decoded(stream, settings) if hasattr(e, "table")]
    for table in (TABLE, FULL):
        mine = [e for e in events if e.table == table]
        state, tombstones = expected_tables(mine, "source")
        assert offsets_by_key(settings, names(settings, table).state) == state, table
        assert offsets_by_key(settings, names(settings, table).tombstones) == tombstones, table
        log = (
            load_catalog(settings).load_table(names(settings, table).log).scan(selected_fields=("partition", "offset"))
        )
        held = [(r["partition"], r["offset"]) for r in log.to_arrow().to_pylist()]
        # each event at most once (a re-delivered one too), and every winner's (log retention trims the others)
        assert len(held) == len(set(held)) and set(held) <= {(e.record.partition, e.record.offset) for e in mine}
        winners = {(e.record.partition, e.record.offset) for _, e, _ in survivors(mine, "source").values()}
        assert winners <= set(held), table


def test_the_kubernetes_example_and_the_image_run_a_valid_configuration(tmp_path, monkeypatch):
    """The Deployment's config loads with the connector's own loader (its secrets given as
    the Secret would), its probe is the job's `/ready`, and the image runs the same command."""
    import yaml

    root = Path(__file__).resolve().parents[1]
    docs = list(yaml.safe_load_all((root / "infra" / "k8s" / "cdclake.yaml").read_text()))
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    (container,) = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"]
    path = tmp_path / "cdclake.toml"
    path.write_text(config_map["data"]["cdclake.toml"])
    for var in container["env"]:
        monkeypatch.setenv(
            var["name"], "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s"
        )
    settings = load_settings(path)
    assert settings.catalog.password is not None and settings.warehouse.startswith("s3://")
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    args = container["args"]
    assert args[:2] == ["run", "-c"] and args[args.index("--metrics-host") + 1] == "0.0.0.0"
    dockerfile = (root / "infra" / "Dockerfile").read_text()
    assert "RUN bash infra/setup.sh --runtime" in dockerfile
    assert f"CMD {json.dumps(args)}" in dockerfile

"""Event Hubs over AMQP, tested at the SDK boundary: no Event Hubs emulator runs here, so the
events are the SDK's own `EventData`, built from AMQP message bytes with `EventData.from_bytes`
(tests/connector/eventhubs_fake.py). The blob checkpoint store is real (Azurite)."""

from __future__ import annotations

import json
import time
from datetime import UTC

import pytest
from pydantic import TypeAdapter

from connector.app import run_compaction, run_ingest
from connector.core.config import load_settings
from connector.core.errors import ConfigError
from connector.core.source_config import SourceConfig
from connector.sources.eventhubs import record_from_event
from iceberg.catalog import load_catalog
from tests.connector.eventhubs_fake import amqp_event
from tests.iceberg.helpers import names, offsets_by_key

SOURCE = TypeAdapter(SourceConfig)

HUB_CS = (
    "Endpoint=sb://cdclake-test.servicebus.windows.net/;SharedAccessKeyName=listen;"
    "SharedAccessKey=hub-s3cr3t;EntityPath=pg.inventory.orders"
)


def test_event_data_maps_to_a_source_record():
    body = json.dumps({"op": "c", "after": {"id": 1}}).encode()
    e = amqp_event(41, "4294967296", 1_700_000_000_123, '{"id":1}', body, {b"trace": b"abc"})
    r = record_from_event("orders", "3", e)
    assert (r.topic, r.partition, r.offset, r.sequence_number) == ("orders", 3, "4294967296", 41)
    assert r.key == b'{"id":1}' and r.value == body and r.headers == (("trace", b"abc"),)
    assert r.enqueued_time.tzinfo is not None and r.enqueued_time.astimezone(UTC).year == 2023
    tomb = record_from_event("orders", "3", amqp_event(42, "4294967400", 1_700_000_000_200, '{"id":1}', None))
    assert tomb.value is None and tomb.key == b'{"id":1}' and tomb.sequence_number == 42


def hub_file(tmp_path, events: dict) -> str:
    path = tmp_path / "hub.json"
    path.write_text(json.dumps(events))
    return str(path)


def pg(op: str, key: int, lsn: int) -> str:
    return json.dumps(
        {
            "op": op,
            "after": None if op == "d" else {"id": key, "lsn": lsn},
            "source": {"connector": "postgresql", "table": "orders", "lsn": lsn},
        }
    )


EVENTS = {
    "0": [
        [0, "0", 1_700_000_000_000, '{"id":1}', pg("c", 1, 10)],
        [1, "120", 1_700_000_000_100, '{"id":1}', pg("d", 1, 12)],
        [2, "240", 1_700_000_000_200, '{"id":1}', None],
    ],
    "1": [[5, "4294967296", 1_700_000_000_050, '{"id":2}', pg("c", 2, 11)]],
}


def eh_settings(settings, tmp_path, events=EVENTS, **source):
    conf = {
        "type": "eventhubs",
        "connection_string": HUB_CS,
        "reader": "tests.connector.eventhubs_fake:reader",
        "reader_options": {"fake_events": hub_file(tmp_path, events)},
        "batch_size": 2,
    } | source
    return settings.model_copy(update={"source": SOURCE.validate_python(conf)})


def log_rows(s):
    t = load_catalog(s).load_table(names(s, "orders").log)
    return sorted(
        (r["partition"], r["sequence_number"], r["offset"], r["op"], r["tombstone"])
        for r in t.scan().to_arrow().to_pylist()
    )


EXPECTED = [
    (0, 0, "0", "c", False),
    (0, 1, "120", "d", False),
    (0, 2, "240", "d", True),
    (1, 5, "4294967296", "c", False),
]


def test_connection_string_never_shows():
    s = load_settings(source={"type": "eventhubs", "connection_string": HUB_CS})
    assert "hub-s3cr3t" not in repr(s) and s.source.eventhubs_options()["event_hub"] == "pg.inventory.orders"
    with pytest.raises(ConfigError) as e:
        load_settings(
            source={"type": "eventhubs", "connection_string": HUB_CS.replace(";EntityPath=pg.inventory.orders", "")}
        )
    assert "hub-s3cr3t" not in str(e.value) and "source.event_hub" in str(e.value)


@pytest.mark.spark
def test_partitions_are_read_on_executors_from_the_committed_positions(spark, settings, tmp_path):
    s = eh_settings(settings, tmp_path)
    assert run_ingest(s).accepted["orders"] == 4
    assert log_rows(s) == EXPECTED
    assert run_ingest(s).records == 0  # the table's positions are where each partition's range starts
    more = {k: list(v) for k, v in EVENTS.items()}
    more["1"].append([6, "4294967400", 1_700_000_000_300, '{"id":2}', pg("u", 2, 13)])
    s2 = eh_settings(settings, tmp_path, more)
    assert run_ingest(s2).accepted["orders"] == 1
    assert log_rows(s2) == sorted(EXPECTED + [(1, 6, "4294967400", "u", False)])


@pytest.mark.spark
def test_a_range_an_executor_cannot_read_fails_the_run_in_one_line(spark, settings, tmp_path):
    """The reader on an executor finds fewer events than the partition's end promised (they
    expired): the run stops with the executor's SourceError, out of Spark's wrapping."""
    from connector.core.errors import SourceError

    s = eh_settings(settings, tmp_path)
    s = s.model_copy(
        update={
            "source": s.source.model_copy(update={"reader_options": {**s.source.reader_options, "fake_missing": "2"}})
        }
    )
    with pytest.raises(SourceError) as e:
        run_ingest(s)
    msg = str(e.value)
    assert "\n" not in msg and "event hub 'pg.inventory.orders' partition" in msg and "retention" in msg


@pytest.mark.azurite
@pytest.mark.spark
def test_checkpoints_are_mirrored_to_blob_storage(settings, tmp_path, azurite):
    from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore
    from azure.storage.blob import BlobServiceClient

    BlobServiceClient.from_connection_string(azurite).create_container("checkpoints")
    s = eh_settings(
        settings,
        tmp_path,
        checkpoint_connection_string=azurite,
        checkpoint_container="checkpoints",
    )
    run_ingest(s)
    store = BlobCheckpointStore.from_connection_string(azurite, "checkpoints")
    got = {
        c["partition_id"]: (c["sequence_number"], c["offset"])
        for c in store.list_checkpoints("cdclake-test.servicebus.windows.net", "pg.inventory.orders", "$Default")
    }
    assert got == {"0": (2, "240"), "1": (5, "4294967296")}


@pytest.mark.azurite
@pytest.mark.spark
def test_the_checkpoints_and_the_warehouse_share_one_storage_account(spark, settings, tmp_path, azurite):
    """The checkpoint store and the warehouse (`abfs://`, through ADLSFileIO and adlfs) in
    two containers of one Azurite account, with one connection string."""
    from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore
    from azure.storage.blob import BlobServiceClient

    from connector.core.config import AzureStorageConfig

    service = BlobServiceClient.from_connection_string(azurite)
    container = f"ehlake{tmp_path.name[-6:].replace('_', '-').lower()}"
    for name in (container, container + "-checkpoints"):
        service.create_container(name)
    s = eh_settings(
        settings, tmp_path, checkpoint_connection_string=azurite, checkpoint_container=container + "-checkpoints"
    )
    lake = s.catalog.model_copy(
        update={
            "name": "ehlake",
            "warehouse": f"abfs://{container}@devstoreaccount1.dfs.core.windows.net/cdc",
            "azure": AzureStorageConfig(connection_string=azurite),
        }
    )
    on_azure = s.model_copy(update={"catalog": lake})
    try:
        run_ingest(on_azure)
        assert log_rows(on_azure) == EXPECTED
        run_compaction(on_azure, force=True)
    finally:
        spark.conf.set("spark.sql.defaultCatalog", settings.catalog.name)
    assert offsets_by_key(on_azure, names(on_azure, "orders").state) == {'{"id":2}': "4294967296"}
    assert any(service.get_container_client(container).list_blobs(name_starts_with="cdc/"))
    store = BlobCheckpointStore.from_connection_string(azurite, container + "-checkpoints")
    got = {c["partition_id"]: c["sequence_number"] for c in store.list_checkpoints(
        "cdclake-test.servicebus.windows.net", "pg.inventory.orders", "$Default")}  # fmt: skip
    assert got == {"0": 2, "1": 5}


def test_blob_storage_down_does_not_hold_ingest_up(settings, tmp_path):
    """Mirroring the checkpoint is best effort: with nothing listening where the blob store
    should be, an update gives up within the store's timeouts, skips the batch's other
    partitions, and counts the failure (`cdclake_position_mirror_failures_total`)."""
    from connector.sources import checkpoint_mirror
    from infra.kafka_broker import free_port
    from quotas.metrics import MIRROR_FAILURES

    account = "devstoreaccount1"
    down = (
        f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey=a2V5;"
        f"BlobEndpoint=http://127.0.0.1:{free_port()}/{account};"
    )
    mirror = checkpoint_mirror(
        eh_settings(settings, tmp_path, checkpoint_connection_string=down, checkpoint_container="c").source
    )
    failures = MIRROR_FAILURES.labels("eventhubs")._value.get()
    started = time.monotonic()
    mirror.update({f"pg.inventory.orders:{p}": (7, "700") for p in range(8)})
    assert time.monotonic() - started < 15
    assert MIRROR_FAILURES.labels("eventhubs")._value.get() == failures + 1


@pytest.mark.spark
def test_compaction_between_micro_batches(spark, settings, tmp_path):
    s = eh_settings(settings, tmp_path)
    s = s.model_copy(update={"compaction": s.compaction.model_copy(update={"between_batches": True})})
    seen = []
    run_ingest(s, on_batch=lambda st: seen.append(dict(st.accepted)))  # batches of 2, each then compacted when due
    assert len(seen) >= 2
    # compacted between batches, with no compaction asked for: the first batch's keys are in the state
    assert offsets_by_key(s, names(s, "orders").state).get('{"id":2}') == "4294967296"
    run_compaction(s, ["orders"], force=True)
    assert offsets_by_key(s, names(s, "orders").state) == {'{"id":2}': "4294967296"}
    assert offsets_by_key(s, names(s, "orders").tombstones) == {'{"id":1}': "240"}


@pytest.mark.spark
@pytest.mark.parametrize(
    "start,expected",
    [
        ("latest", []),
        (1, [(0, 1), (0, 2), (1, 5)]),  # a sequence number; partition 1 begins at 5
        ("2023-11-14T22:13:20.100Z", [(0, 1), (0, 2)]),  # an enqueued time
    ],
)
def test_starting_positions_for_partitions_without_a_committed_position(settings, tmp_path, start, expected):
    s = eh_settings(settings, tmp_path, starting_position=start)
    run_ingest(s)
    rows = log_rows(s) if load_catalog(s).table_exists(names(s, "orders").log) else []
    assert [(p, seq) for p, seq, *_ in rows] == expected


def test_an_unreachable_namespace_is_one_line_naming_it(settings):
    """The SDK's own client against a closed port on 127.0.0.1 (nothing listens there): its
    ConnectError becomes a SourceError of one line that names the hub and host, never the key."""
    import socket

    from connector.core.errors import SourceError
    from connector.sources.eventhubs import SdkPartitionReader

    with socket.socket() as s:  # a free port, closed again: connections to it are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cs = f"Endpoint=sb://127.0.0.1:{port}/;SharedAccessKeyName=listen;SharedAccessKey=s3cr3t="
    reader = SdkPartitionReader(cs, "orders", retry_total=0)
    with pytest.raises(SourceError) as e:
        reader.partition_ids()
    msg = str(e.value)
    assert "\n" not in msg and f"event hub 'orders' at 127.0.0.1:{port}" in msg and "ConnectError" in msg
    assert "s3cr3t" not in msg

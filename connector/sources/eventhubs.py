"""Event Hubs over AMQP (azure-eventhub), behind a small partition-reader interface.

No Event Hubs emulator exists to test against, so everything past `PartitionReader` is
tested with the SDK's own `EventData` built from AMQP message bytes; `SdkPartitionReader`
is the thin adapter to `EventHubConsumerClient`, whose connection errors are tested against
a closed loopback port and whose receive path is the only part the tests do not run.

`EventHubsSource` plans each batch on the driver (sequence-number ranges per partition, from
the committed positions) and `EventHubsDataSource`, a PySpark Python data source, reads each
partition's range on an executor.
"""

from __future__ import annotations

import importlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from connector.core.errors import SourceError
from connector.core.records import SourceRecord, stream_id
from connector.sources import RAW_COLUMNS, Source, initial_position, share
from quotas.metrics import MIRROR_FAILURES

log = logging.getLogger(__name__)


class PartitionReader(Protocol):
    def partition_ids(self) -> list[str]: ...

    def end_sequence_number(self, partition_id: str) -> int:
        """The sequence number after the last enqueued event (0 for an empty partition)."""

    def read(self, partition_id: str, from_sequence_number: int, max_events: int) -> Sequence[Any]:
        """Up to `max_events` EventData from `from_sequence_number` (inclusive), in order."""

    def sequence_number_at(self, partition_id: str, when: datetime) -> int:
        """The sequence number of the first event enqueued at or after `when` (else the end)."""


def initial_sequence_number(reader: PartitionReader, pid: str, starting: str | int | datetime, end: int) -> int:
    """`initial_position` for an Event Hubs partition (0: the reader starts at the first retained event)."""
    return initial_position(starting, 0, end, lambda when: reader.sequence_number_at(pid, when))


def _bytes(v: Any) -> bytes | None:
    if v is None:
        return None
    return v if isinstance(v, bytes) else str(v).encode()


def record_from_event(event_hub: str, partition_id: str, event: Any) -> SourceRecord:
    """Maps an azure.eventhub EventData to a SourceRecord. An event without a body is a tombstone."""
    body = event.body
    if body is None:
        value = None
    elif isinstance(body, (bytes, str)):
        value = _bytes(body)
    else:  # AMQP data sections arrive as a generator of bytes
        value = b"".join(_bytes(part) or b"" for part in body)
    enqueued = event.enqueued_time or datetime.now(UTC)
    headers = tuple(
        (k.decode() if isinstance(k, bytes) else str(k), _bytes(v)) for k, v in (event.properties or {}).items()
    )
    return SourceRecord(
        topic=event_hub,
        partition=int(partition_id),
        offset=str(event.offset),
        sequence_number=int(event.sequence_number),
        enqueued_time=enqueued,
        key=_bytes(event.partition_key),
        value=value,
        headers=headers,
    )


class SdkPartitionReader:
    """`EventHubConsumerClient` as a PartitionReader (receive_batch on a helper thread)."""

    def __init__(self, connection_string: str, event_hub: str, consumer_group: str = "$Default", **client: Any):
        from azure.eventhub import EventHubConsumerClient

        self._client: Callable[[], Any] = lambda: EventHubConsumerClient.from_connection_string(
            connection_string, consumer_group=consumer_group, eventhub_name=event_hub, **client
        )
        self._meta = self._client()
        self._where = f"event hub {event_hub!r} at {_endpoint(connection_string)}"

    def _ask(self, what: str, call: Any) -> Any:
        """A metadata call; the SDK's connection errors become one clear line."""
        from azure.eventhub.exceptions import EventHubError

        try:
            return call()
        except EventHubError as e:
            detail = " ".join(str(e).split())[:300]
            raise SourceError(
                f"{self._where}: {what} failed: {type(e).__name__}: {detail}; check "
                "source.connection_string and that the namespace is reachable"
            ) from None

    def partition_ids(self) -> list[str]:
        return list(self._ask("listing partitions", self._meta.get_partition_ids))

    def end_sequence_number(self, partition_id: str) -> int:
        props = self._ask(
            f"reading partition {partition_id}", lambda: self._meta.get_partition_properties(partition_id)
        )
        return -1 if props["is_empty"] else int(props["last_enqueued_sequence_number"]) + 1

    def sequence_number_at(self, partition_id: str, when: datetime) -> int:
        events = self._receive(partition_id, when, 1)
        return int(events[0].sequence_number) if events else self.end_sequence_number(partition_id)

    def read(self, partition_id: str, from_sequence_number: int, max_events: int) -> Sequence[Any]:
        return self._receive(partition_id, from_sequence_number, max_events)

    def _receive(self, partition_id: str, start: int | datetime, max_events: int) -> Sequence[Any]:
        client, done = self._client(), threading.Event()
        got: list[Any] = []

        def on_batch(_ctx: Any, events: list[Any]) -> None:
            got.extend(events)
            done.set()

        worker = threading.Thread(
            target=client.receive_batch,
            kwargs=dict(
                on_event_batch=on_batch,
                partition_id=partition_id,
                starting_position=start,
                starting_position_inclusive=True,
                max_batch_size=max_events,
                max_wait_time=5,
            ),
            daemon=True,
        )
        worker.start()
        done.wait(60)
        client.close()
        worker.join(10)
        return got


def _endpoint(connection_string: str) -> str:
    """The namespace host of a connection string (never its key)."""
    return connection_string.split("Endpoint=sb://", 1)[-1].split(";", 1)[0].rstrip("/") or "?"


def load_reader(spec: str, options: Mapping[str, str]) -> PartitionReader:
    """`module:factory` -> factory(options); the default builds an SdkPartitionReader."""
    module, _, name = spec.partition(":")
    reader: PartitionReader = getattr(importlib.import_module(module), name)(options)
    return reader


def sdk_reader(options: Mapping[str, str]) -> PartitionReader:
    return SdkPartitionReader(
        options["connection_string"], options["event_hub"], options.get("consumer_group", "$Default")
    )


class CheckpointMirror:
    """Mirrors committed positions into a `BlobCheckpointStore`, so Azure tooling sees them."""

    def __init__(self, store: Any, namespace: str, event_hub: str, consumer_group: str = "$Default"):
        self.store, self.namespace, self.event_hub, self.group = store, namespace, event_hub, consumer_group

    def update(self, last: Mapping[str, tuple[int, str]]) -> None:
        """Best effort, bounded by the store's timeouts (`checkpoint_mirror`): the first
        failure skips the rest of the batch's partitions; the next batch tries again."""
        for stream, (seq, offset) in sorted(last.items()):
            try:
                self.store.update_checkpoint(
                    {
                        "fully_qualified_namespace": self.namespace,
                        "eventhub_name": self.event_hub,
                        "consumer_group": self.group,
                        "partition_id": stream.rsplit(":", 1)[1],
                        "sequence_number": seq,
                        "offset": offset,
                    }
                )
            except Exception as e:  # noqa: BLE001 - tooling only: the Iceberg tables hold the truth
                MIRROR_FAILURES.labels("eventhubs").inc()
                log.warning("could not mirror the checkpoint of %s to blob storage: %s", stream, str(e).splitlines()[0])
                return


# --- Spark ------------------------------------------------------------------------------


class EventHubsSource(Source):
    """Event Hubs read by Spark: the driver plans sequence-number ranges per partition (from
    the committed position, up to the end each partition had at seek time; at most about
    `max_events` a batch, shared in proportion to each partition's lag); the
    `cdclake-eventhubs` data source reads each partition's range on an executor."""

    def __init__(
        self,
        reader: PartitionReader,
        options: Mapping[str, str],
        starting_position: str | int | datetime = "earliest",
        checkpoints: CheckpointMirror | None = None,
    ):
        self.reader, self.options, self.event_hub = reader, dict(options), options["event_hub"]
        self.starting, self.checkpoints = starting_position, checkpoints
        self._next: dict[str, int] = {}
        self._end: dict[str, int] = {}

    def seek(self, positions: Mapping[str, int]) -> None:
        self._next, self._end = {}, {}
        for pid in self.reader.partition_ids():
            stream = stream_id(self.event_hub, int(pid))
            self._end[pid] = max(self.reader.end_sequence_number(pid), 0)
            self._next[pid] = (
                positions[stream]
                if stream in positions
                else initial_sequence_number(self.reader, pid, self.starting, self._end[pid])
            )

    def next_frame(self, spark: Any, max_events: int) -> Any:
        nxt, end = self._next, self._end
        ranges = {
            pid: [nxt[pid], nxt[pid] + n] for pid, n in share({p: end[p] - nxt[p] for p in nxt}, max_events).items()
        }
        if not ranges:
            return None
        for pid, (_, stop) in ranges.items():
            nxt[pid] = stop
        spark.dataSource.register(EventHubsDataSource)
        return (
            spark.read.format(EventHubsDataSource.name())
            .options(**self.options)
            .option("ranges", json.dumps(ranges))
            .load()
        )

    def commit(self, last: Mapping[str, tuple[int, str]]) -> None:
        if self.checkpoints is not None:
            self.checkpoints.update(last)


try:
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
except ImportError:  # pragma: no cover - pyspark < 4
    DataSource = DataSourceReader = InputPartition = object  # type: ignore[misc,assignment]


class EventHubsPartition(InputPartition):
    def __init__(self, pid: str, start: int, end: int):
        self.pid, self.start, self.end = pid, start, end


class EventHubsRangeReader(DataSourceReader):
    """Reads `ranges` ({partition id: [first, end) sequence numbers}) with the configured reader."""

    def __init__(self, options: Mapping[str, str]):
        self.options = dict(options)
        self.event_hub = self.options["event_hub"]
        self.ranges = json.loads(self.options["ranges"])

    def partitions(self) -> list[EventHubsPartition]:
        return [EventHubsPartition(pid, start, end) for pid, (start, end) in sorted(self.ranges.items())]

    def read(self, partition: EventHubsPartition) -> Iterator[Any]:  # type: ignore[override]  # Spark passes ours
        from connector.batch import RecordBatch

        reader = load_reader(self.options.get("reader", f"{__name__}:sdk_reader"), self.options)
        nxt = partition.start
        while nxt < partition.end:
            events = reader.read(partition.pid, nxt, min(1000, partition.end - nxt))
            if not events:
                raise SourceError(
                    f"event hub {self.event_hub!r} partition {partition.pid}: no events from sequence number "
                    f"{nxt} although the batch ends at {partition.end}; they may have expired (retention): "
                    "check the hub's retention"
                )
            records = [record_from_event(self.event_hub, partition.pid, e) for e in events]
            nxt = records[-1].sequence_number + 1
            yield from RecordBatch.of(records).table.to_batches()


class EventHubsDataSource(DataSource):
    """`spark.read.format("cdclake-eventhubs").option("ranges", ...)`: records of those ranges."""

    @classmethod
    def name(cls) -> str:
        return "cdclake-eventhubs"

    def schema(self) -> str:
        return RAW_COLUMNS

    def reader(self, schema: Any) -> EventHubsRangeReader:
        return EventHubsRangeReader(self.options)

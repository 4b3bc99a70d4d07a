"""Sources: where records come from; `load_source` picks one from the configuration.

A source never decides what is committed: the pipeline seeks it to the positions recovered
from the Iceberg tables, and calls `commit` after each Iceberg commit only to mirror the
positions into the source's own tooling (consumer groups, blob checkpoints).

A source plans bounded batches on the driver (offset ranges per partition, byte
ranges of a file: metadata only) and gives each as a Spark DataFrame that the executors
read: raw records (`RAW_COLUMNS`) from Spark's own Kafka source (Kafka, Event Hubs' Kafka
endpoint) or a PySpark Python data source (Event Hubs AMQP); a kcat dump's line ranges,
which the decode stage reads itself (`Source.expand`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from connector.core.source_config import EventHubsSourceConfig, SourceConfig
    from connector.sources.eventhubs import CheckpointMirror


def initial_position(starting: str | int | datetime, low: int, high: int, at_time: Callable[[datetime], int]) -> int:
    """Where a partition with no committed position starts: `low`/`high` are the first retained
    and the next position; a number is clamped into them; a time is looked up by `at_time`."""
    if starting == "earliest":
        return low
    if starting == "latest":
        return high
    if isinstance(starting, int):
        return min(max(starting, low), high)
    if isinstance(starting, str):
        raise ValueError(f"starting position {starting!r}: earliest, latest, a number or a time")
    return at_time(starting)


# Every source's records as Spark reads them: Spark's Kafka source's columns and header
# type, the offset also as text (an Event Hubs offset is not the sequence number).
RAW_COLUMNS = (
    "topic string, partition int, offset string, sequence_number bigint, enqueued_time timestamp, "
    "key binary, value binary, headers array<struct<key: string, value: binary>>"
)


def share(lags: Mapping[str, int], max_events: int) -> dict[str, int]:
    """How many events each stream reads in the next batch: all of them if the lags fit in
    `max_events`, else a share in proportion to each stream's lag (at least one), like
    Spark's `maxOffsetsPerTrigger`."""
    waiting = {s: n for s, n in lags.items() if n > 0}
    total = sum(waiting.values())
    if total <= max_events:
        return waiting
    return {s: max(1, n * max_events // total) for s, n in waiting.items()}


class Source(ABC):
    """A source Spark reads in bounded batches: `seek`, then `next_frame` until it gives None."""

    @abstractmethod
    def seek(self, positions: Mapping[str, int]) -> None:
        """Start each stream (`topic:partition`) at its next sequence number; read up to
        the end each partition has now (like Spark's `availableNow`)."""

    @abstractmethod
    def next_frame(self, spark: SparkSession, max_events: int) -> DataFrame | None:
        """The next batch of at most about `max_events` records (`RAW_COLUMNS`), or None
        when caught up."""

    def expand(self) -> Callable[[pa.Table], pa.Table] | None:
        """None when `next_frame` gives the records themselves; else a function the decode
        stage runs on the executors to turn the frame's rows (what to read) into records
        (`connector.batch.RECORD_SCHEMA`)."""
        return None

    def commit(self, last: Mapping[str, tuple[int, str]]) -> None:  # noqa: B027 - optional hook
        """Mirror committed positions into the source's tooling: per stream, the sequence
        number and offset of the last record committed."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_source(config: SourceConfig) -> Source:
    from connector.core.source_config import EventHubsSourceConfig, FileSourceConfig

    if isinstance(config, FileSourceConfig):
        from connector.sources.file import FileSource

        return FileSource(config.path or "", default_topic=config.topic)  # no path: "no such file"
    if not isinstance(config, EventHubsSourceConfig):
        from connector.sources.kafka import KafkaSource

        return KafkaSource(config)
    from connector.sources.eventhubs import EventHubsSource, load_reader

    options = config.eventhubs_options()
    return EventHubsSource(
        load_reader(config.reader, options), options, config.starting_position, checkpoint_mirror(config)
    )


def checkpoint_mirror(config: EventHubsSourceConfig) -> CheckpointMirror | None:
    """A CheckpointMirror on the configured blob container, or None."""
    if not config.checkpoint_connection_string:
        return None
    from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore
    from azure.storage.blob import ExponentialRetry

    from connector.sources.eventhubs import CheckpointMirror

    options = config.eventhubs_options()
    fqns = options["connection_string"].split("Endpoint=sb://", 1)[-1].split("/", 1)[0].split(";", 1)[0]
    store = BlobCheckpointStore.from_connection_string(  # bounded: mirroring never holds ingest up long
        config.checkpoint_connection_string.get_secret_value(),
        config.checkpoint_container or "",
        retry_policy=ExponentialRetry(initial_backoff=1, increment_base=2, retry_total=2),  # default: 15 s backoffs
        connection_timeout=5,
        read_timeout=10,
    )
    return CheckpointMirror(store, fqns, options["event_hub"], config.consumer_group)

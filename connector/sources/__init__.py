"""Sources deliver SourceRecords; `load_source` picks one from the configuration.

A source never decides what is committed: the pipeline seeks it to the positions recovered
from the Iceberg tables, and calls `commit` after each Iceberg commit only to mirror the
positions into the source's own tooling (consumer groups, blob checkpoints).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from connector.core.records import SourceRecord

if TYPE_CHECKING:
    from connector.batch import RecordBatch
    from connector.core.config import EventHubsSourceConfig, SourceConfig
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


class Source(ABC):
    @abstractmethod
    def seek(self, positions: Mapping[str, int]) -> None:
        """Start each stream (`topic:partition`) at its next sequence number."""

    @abstractmethod
    def poll(self, max_records: int) -> list[SourceRecord]:
        """Up to `max_records` records in log order per partition; [] when caught up."""

    def poll_batch(self, max_records: int) -> RecordBatch:
        """`poll` as Arrow columns; sources that can read columns directly override it."""
        from connector.batch import RecordBatch

        return RecordBatch.of(self.poll(max_records))

    def commit(self, positions: Mapping[str, int]) -> None:  # noqa: B027 - optional hook
        """Mirror committed positions into the source's tooling (no-op by default)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and files."""

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_source(config: SourceConfig) -> Source:
    from connector.core.config import EventHubsSourceConfig, FileSourceConfig

    if isinstance(config, FileSourceConfig):
        from connector.sources.file import FileSource

        return FileSource(config.path or "", default_topic=config.topic)  # no path: "no such file"
    if not isinstance(config, EventHubsSourceConfig):
        from connector.sources.kafka import KafkaSource

        return KafkaSource(
            config.kafka_settings(),
            config.topics,
            config.group_id,
            config.starting_position,
            config.fail_on_data_loss,
            config.unavailable_timeout_seconds,
        )
    from connector.sources.eventhubs import EventHubsSource, load_reader

    options = config.eventhubs_options()
    return EventHubsSource(
        load_reader(config.reader, options),
        options["event_hub"],
        config.starting_position,
        checkpoint_mirror(config),
    )


def checkpoint_mirror(config: EventHubsSourceConfig) -> CheckpointMirror | None:
    """A CheckpointMirror on the configured blob container, or None."""
    if not config.checkpoint_connection_string:
        return None
    from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore

    from connector.sources.eventhubs import CheckpointMirror

    options = config.eventhubs_options()
    fqns = options["connection_string"].split("Endpoint=sb://", 1)[-1].split("/", 1)[0].split(";", 1)[0]
    store = BlobCheckpointStore.from_connection_string(
        config.checkpoint_connection_string.get_secret_value(), config.checkpoint_container or ""
    )
    return CheckpointMirror(store, fqns, options["event_hub"], config.consumer_group)

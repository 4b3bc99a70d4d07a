"""Kafka source (also Event Hubs through its Kafka endpoint): Spark's own Kafka source reads
the records; confluent-kafka on the driver reads metadata only.

The pipeline seeks every partition to the position recovered from the Iceberg tables; each
batch is an offset range per partition, read by Spark up to the end offset each partition
had at seek time (one-shot, like Spark's `availableNow`; `cdclake run --every N` repeats
it). The consumer group's offsets are only written after each Iceberg commit, so lag tools
see progress.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from connector.core.errors import SourceError
from connector.core.records import stream_id
from connector.sources import Source, initial_position, share
from quotas.metrics import MIRROR_FAILURES

if TYPE_CHECKING:
    from connector.core.source_config import EventHubsKafkaSourceConfig, KafkaSourceConfig

    _KafkaConfig = KafkaSourceConfig | EventHubsKafkaSourceConfig

log = logging.getLogger(__name__)
T = TypeVar("T")
METADATA_REFRESH_SECONDS = 10.0


def matching_topics(names: Iterable[str], pattern: str) -> list[str]:
    """The topics whose whole name matches `pattern`, never Kafka's internal `__*` topics
    (`__consumer_offsets`...)."""
    regex = re.compile(pattern)
    return sorted(n for n in names if not n.startswith("__") and regex.fullmatch(n))


def retrying(call: Callable[[], T], timeout: float, what: str) -> T:
    """`call()`, retried with backoff while Kafka answers with a retriable error (a restarted
    broker has no partition leaders for a moment); a clear SourceError after `timeout`."""
    deadline, delay = time.monotonic() + timeout, 0.2
    while True:
        try:
            return call()
        except KafkaException as e:
            err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
            retriable = err is not None and (
                err.retriable()
                or err.code()
                in (
                    KafkaError.NOT_LEADER_FOR_PARTITION,
                    KafkaError.LEADER_NOT_AVAILABLE,
                    KafkaError._TRANSPORT,
                    KafkaError._TIMED_OUT,
                    KafkaError._ALL_BROKERS_DOWN,
                )
            )
            if not retriable or time.monotonic() + delay > deadline:
                raise SourceError(
                    f"{what} failed for {timeout:g}s: {err.str() if err else e}; the committed "
                    "positions are safe: fix the broker or the settings, then rerun"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


class KafkaOffsets:
    """The driver's view of the topics (confluent-kafka, metadata only): the partitions, where
    each starts (the committed position, else `starting_position`; a committed position the
    broker no longer holds is data loss), the end offsets at seek time, and the consumer
    group's offsets, written after each Iceberg commit so lag tools see progress. With a
    `pattern` instead of `topics`, the topics are those of the cluster that match it."""

    def __init__(
        self,
        settings: Mapping[str, str],
        topics: list[str],
        group_id: str,
        starting_position: str | int | datetime = "earliest",
        fail_on_data_loss: bool = True,
        unavailable_timeout: float = 60.0,
        pattern: str | None = None,
    ):
        self.where = settings.get("bootstrap.servers", "?")
        self.topics, self.starting, self.pattern = list(topics), starting_position, pattern
        self._matched: list[str] | None = None  # the topics the pattern matched last (logged when they change)
        self.fail_on_data_loss, self.unavailable_timeout = fail_on_data_loss, unavailable_timeout
        self._last_error: KafkaError | None = None
        self.consumer = Consumer(
            {
                **settings,
                "group.id": group_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "error_cb": self._on_error,
                "logger": logging.getLogger("librdkafka"),  # its own lines through logging: shown with -v
                "on_commit": self._on_commit,
                "reconnect.backoff.max.ms": 5000,
            }
        )
        self._positions: dict[str, int] = {}
        self._end: dict[str, int] = {}
        self._assigned: set[tuple[str, int]] = set()
        self._refreshed = 0.0

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if err is not None:
            MIRROR_FAILURES.labels("kafka").inc()
            log.warning("could not mirror positions to the consumer group at %s: %s", self.where, err.str())

    def _on_error(self, err: KafkaError) -> None:
        self._last_error = err  # reported when the wait runs out (`_unreachable`); meanwhile with -v
        log.info("kafka %s: %s", self.where, err.str())

    def _partitions(self) -> set[tuple[str, int]]:
        try:
            meta = self.consumer.list_topics(timeout=self.unavailable_timeout)
        except KafkaException as e:
            raise SourceError(self._unreachable(str(e))) from None
        if self.pattern is not None:
            return self._matching(meta.topics)
        out = set()
        for topic in self.topics:
            t = meta.topics.get(topic)
            if t is None or t.error is not None:
                raise SourceError(
                    f"topic {topic!r} does not exist at {self.where} "
                    f"({t.error if t else 'unknown topic'}); create it or fix source.topics"
                )
            out |= {(topic, p) for p in t.partitions}
        self._refreshed = time.monotonic()
        return out

    def _matching(self, topics: Mapping[str, Any]) -> set[tuple[str, int]]:
        """The partitions of the topics the pattern matches. A topic the broker reports with an
        error (one just created may have no leader yet) is left to the next listing."""
        names = matching_topics(topics, self.pattern or "")
        ready = [n for n in names if topics[n].error is None]
        if names != self._matched:  # logged when it changes, not every batch
            self._matched = names
            if not names:
                log.info("no topic at %s matches source.topics_pattern %r yet", self.where, self.pattern)
            else:
                waiting = {n: str(topics[n].error) for n in names if n not in ready}
                log.info("topics at %s matching %r: %s (not ready: %s)", self.where, self.pattern, names, waiting)
        self._refreshed = time.monotonic()
        return {(n, p) for n in ready for p in topics[n].partitions}

    def _unreachable(self, detail: str) -> str:
        return (
            f"Kafka at {self.where} unreachable for {self.unavailable_timeout:g}s ({detail}); the committed "
            "positions are safe: start the broker or fix source.bootstrap_servers / credentials, then rerun"
        )

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """The partition's first retained offset and its next offset."""
        low, high = retrying(
            lambda: self.consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self.unavailable_timeout
            ),
            self.unavailable_timeout,
            f"Kafka at {self.where}: offsets of {topic}:{partition}",
        )
        return int(low), int(high)

    def _start(self, topic: str, partition: int) -> int:
        low, high = self.watermarks(topic, partition)
        stream = stream_id(topic, partition)
        self._end[stream] = high
        if stream not in self._positions:
            return initial_offset(self.consumer, topic, partition, low, high, self.starting, self.unavailable_timeout)
        return self.retained(topic, partition, self._positions[stream], low)

    def retained(self, topic: str, partition: int, start: int, low: int) -> int:
        """Where to read from `start` when the partition's first retained offset is `low`:
        offsets below it were never ingested and are gone (data loss)."""
        if start < low:
            msg = (
                f"topic {topic!r} partition {partition}: offsets [{start}, {low}) no longer exist in the source "
                "(expired by retention or removed by compaction) and were never ingested"
            )
            if self.fail_on_data_loss:
                raise SourceError(
                    msg + f"; set source.fail_on_data_loss = false to continue from offset {low} and accept the loss"
                )
            log.error("%s; continuing from %s (fail_on_data_loss = false)", msg, low)
            return low
        return start

    def _assign(self, parts: set[tuple[str, int]]) -> None:
        """Adds partitions: where each starts, and its end offset now. Nothing is assigned to
        the consumer (it would prefetch records the driver never reads)."""
        new = sorted(parts - self._assigned)
        if not new:
            return
        for t, p in new:
            self._positions[stream_id(t, p)] = self._start(t, p)
        self._assigned |= set(new)
        log.info("partitions from %s", [(t, p, self._positions[stream_id(t, p)]) for t, p in new])

    def seek(self, positions: Mapping[str, int]) -> None:
        self._positions = dict(positions)
        self._assigned = set()
        self._assign(self._partitions())

    def commit(self, positions: Mapping[str, int]) -> None:
        offsets = [
            TopicPartition(t, p, positions[stream_id(t, p)])
            for t, p in sorted(self._assigned)
            if stream_id(t, p) in positions
        ]
        self.consumer.poll(0)  # serves the previous commit's outcome (`_on_commit`)
        if not offsets:
            return
        try:  # tooling only (the Iceberg tables hold the truth): never waits for the broker
            self.consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as e:
            MIRROR_FAILURES.labels("kafka").inc()
            log.warning("could not mirror positions to the consumer group at %s: %s", self.where, e)

    def close(self) -> None:
        self.consumer.close()


def initial_offset(
    consumer: Consumer, topic: str, partition: int, low: int, high: int, starting: str | int | datetime, timeout: float
) -> int:
    """`initial_position` for a Kafka partition (a time is looked up with offsets_for_times)."""

    def at_time(when: datetime) -> int:
        found = consumer.offsets_for_times(
            [TopicPartition(topic, partition, int(when.timestamp() * 1000))], timeout=timeout
        )[0].offset
        return high if found < 0 else found

    return initial_position(starting, low, high, at_time)


def _jaas_value(v: str) -> str:
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def spark_kafka_options(settings: Mapping[str, str]) -> dict[str, str]:
    """librdkafka settings as Spark Kafka source options (`kafka.` + the Java client's names):
    `sasl.mechanisms` is `sasl.mechanism`, and a user name and password become the JAAS
    login of their mechanism (PLAIN, or SCRAM-SHA-256/512). Other keys pass through, the
    names both clients share (`client.id`, `ssl.*` files...)."""
    conf = dict(settings)
    mechanism = conf.pop("sasl.mechanisms", None) or conf.pop("sasl.mechanism", None)
    user, password = conf.pop("sasl.username", None), conf.pop("sasl.password", None)
    out = {f"kafka.{k}": v for k, v in conf.items()}
    if mechanism:
        out["kafka.sasl.mechanism"] = mechanism
    if user is not None:
        module = (
            "org.apache.kafka.common.security.scram.ScramLoginModule"
            if (mechanism or "").upper().startswith("SCRAM")
            else "org.apache.kafka.common.security.plain.PlainLoginModule"
        )
        out["kafka.sasl.jaas.config"] = (
            f"{module} required username={_jaas_value(user)} password={_jaas_value(password or '')};"
        )
    return out


def read_options(group_id: str, settings: Mapping[str, str], fail_on_data_loss: bool) -> dict[str, str]:
    """The options of every Spark Kafka read of a source (the offset ranges come per batch)."""
    return {
        # one group id for every batch: Spark pools its consumers (with the records they
        # prefetched) by group id and partition, so each batch reuses the last one's; a
        # random group per batch would add one per partition each batch. `assign`: no
        # group membership.
        "kafka.group.id": group_id,
        # bigger fetches and the OS's socket buffer (the Java client's are 1 MB and 64 kB): a
        # backlog streams in fewer round trips; `source.kafka.max.partition.fetch.bytes` wins
        "kafka.max.partition.fetch.bytes": str(8 << 20),
        "kafka.receive.buffer.bytes": "-1",
        # a batch's ranges end at offsets the broker holds, so no fetch needs to wait for new
        # records; at the Java client's 500 ms each partition's read paid about that once
        # (200 partitions of 10 records: 54 s a batch, against 4.9 s)
        "kafka.fetch.max.wait.ms": "10",
        **spark_kafka_options(settings),
        "includeHeaders": "true",
        "failOnDataLoss": str(fail_on_data_loss).lower(),
    }


class KafkaSource(Source):
    """Kafka (or Event Hubs' Kafka endpoint) read by Spark's own Kafka source, one bounded
    batch of offset ranges at a time. A confluent-kafka consumer on the driver only reads
    metadata (partitions, watermarks, offsets for a time) and mirrors the consumer group's
    offsets."""

    def __init__(self, config: _KafkaConfig):
        settings = config.kafka_settings()
        self.meta = KafkaOffsets(
            settings,
            config.topics or [],
            config.group_id,
            config.starting_position,
            config.fail_on_data_loss,
            config.unavailable_timeout_seconds,
            config.topics_pattern,
        )
        self.options = read_options(config.group_id, settings, config.fail_on_data_loss)

    def seek(self, positions: Mapping[str, int]) -> None:
        self.meta.seek(positions)

    def next_frame(self, spark: Any, max_events: int) -> Any:
        meta = self.meta
        # partitions added while running; with a pattern every batch, so that a topic created
        # while the job runs is read from the next batch
        if meta.pattern is not None or time.monotonic() - meta._refreshed > METADATA_REFRESH_SECONDS:
            meta._assign(meta._partitions())
        ranges: dict[str, dict[str, list[int]]] = {}
        for topic, part in meta._assigned:  # retention may have removed offsets since the last batch
            at = stream_id(topic, part)
            if meta._positions[at] < meta._end[at]:
                meta._positions[at] = meta.retained(topic, part, meta._positions[at], meta.watermarks(topic, part)[0])
        lags = {
            stream_id(t, p): meta._end[stream_id(t, p)] - meta._positions[stream_id(t, p)] for t, p in meta._assigned
        }
        for stream, n in sorted(share(lags, max_events).items()):
            topic, p = stream.rsplit(":", 1)
            start = meta._positions[stream]
            ranges.setdefault(topic, {})[p] = [start, start + n]
            meta._positions[stream] = start + n
        if not ranges:
            return None
        frame = (
            spark.read.format("kafka")
            .options(**self.options)
            .option("assign", json.dumps({t: [int(p) for p in ps] for t, ps in ranges.items()}))
            .option("startingOffsets", json.dumps({t: {p: r[0] for p, r in ps.items()} for t, ps in ranges.items()}))
            .option("endingOffsets", json.dumps({t: {p: r[1] for p, r in ps.items()} for t, ps in ranges.items()}))
            .load()
        )
        # one task per partition costs a Python worker's turn each (200 partitions of 10
        # records: 14.6 s against 2.2 s in two tasks): many small ranges share a task
        tasks = 2 * spark.sparkContext.defaultParallelism
        if sum(len(ps) for ps in ranges.values()) > tasks:
            frame = frame.coalesce(tasks)
        return frame.selectExpr(
            "topic",
            "partition",
            "cast(offset as string) as offset",
            "offset as sequence_number",
            "timestamp as enqueued_time",
            "key",
            "value",
            "headers",
        )

    def commit(self, last: Mapping[str, tuple[int, str]]) -> None:
        self.meta.commit({s: seq + 1 for s, (seq, _) in last.items()})

    def close(self) -> None:
        self.meta.close()


__all__ = ["KafkaOffsets", "KafkaSource", "matching_topics", "read_options", "spark_kafka_options"]

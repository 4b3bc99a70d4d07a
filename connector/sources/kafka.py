"""Kafka source (also Event Hubs through its Kafka endpoint), with confluent-kafka.

Partitions are assigned explicitly (no group rebalancing): the pipeline seeks every
partition to the position recovered from the Iceberg tables; the consumer group's offsets
are only written after each Iceberg commit, so lag tools see progress. A poll ends when
every partition reached the end offset it had at seek time (one-shot, like Spark's
`availableNow`); `cdclake run --every N` repeats it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from connector.core.errors import SourceError
from connector.core.records import SourceRecord, stream_id
from connector.sources import Source, initial_position

log = logging.getLogger(__name__)
METADATA_REFRESH_SECONDS = 10.0


def retrying(call, timeout: float, what: str):
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


class KafkaSource(Source):
    def __init__(
        self,
        settings: Mapping[str, str],
        topics: list[str],
        group_id: str,
        starting_position: str | int | datetime = "earliest",
        fail_on_data_loss: bool = True,
        unavailable_timeout: float = 60.0,
    ):
        self.where = settings.get("bootstrap.servers", "?")
        self.topics, self.starting = list(topics), starting_position
        self.fail_on_data_loss, self.unavailable_timeout = fail_on_data_loss, unavailable_timeout
        self._last_error: KafkaError | None = None
        self.consumer = Consumer(
            {
                **settings,
                "group.id": group_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "error_cb": self._on_error,
                "reconnect.backoff.max.ms": 5000,
            }
        )
        self._positions: dict[str, int] = {}
        self._end: dict[str, int] = {}
        self._assigned: set[tuple[str, int]] = set()
        self._refreshed = 0.0

    def _on_error(self, err: KafkaError) -> None:
        self._last_error = err
        log.warning("kafka %s: %s", self.where, err.str())

    def _partitions(self) -> set[tuple[str, int]]:
        try:
            meta = self.consumer.list_topics(timeout=self.unavailable_timeout)
        except KafkaException as e:
            raise SourceError(self._unreachable(str(e))) from None
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

    def _unreachable(self, detail: str) -> str:
        return (
            f"Kafka at {self.where} unreachable for {self.unavailable_timeout:g}s ({detail}); the committed "
            "positions are safe: start the broker or fix source.bootstrap_servers / credentials, then rerun"
        )

    def _start(self, topic: str, partition: int) -> int:
        low, high = retrying(
            lambda: self.consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self.unavailable_timeout
            ),
            self.unavailable_timeout,
            f"Kafka at {self.where}: offsets of {topic}:{partition}",
        )
        stream = stream_id(topic, partition)
        self._end[stream] = high
        if stream not in self._positions:
            return initial_offset(self.consumer, topic, partition, low, high, self.starting, self.unavailable_timeout)
        start = self._positions[stream]
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
        new = sorted(parts - self._assigned)
        if not new:
            return
        tps = [TopicPartition(t, p, self._start(t, p)) for t, p in new]
        for tp in tps:
            self._positions[stream_id(tp.topic, tp.partition)] = tp.offset
        self.consumer.incremental_assign(tps)
        self._assigned |= set(new)
        log.info("assigned %s", [(tp.topic, tp.partition, tp.offset) for tp in tps])

    def seek(self, positions: Mapping[str, int]) -> None:
        self._positions = dict(positions)
        if self._assigned:
            self.consumer.incremental_unassign([TopicPartition(t, p) for t, p in self._assigned])
            self._assigned = set()
        self._assign(self._partitions())

    def _caught_up(self) -> bool:
        return all(
            self._positions.get(stream_id(t, p), 0) >= self._end.get(stream_id(t, p), 0) for t, p in self._assigned
        )

    def poll(self, max_records: int) -> list[SourceRecord]:
        out: list[SourceRecord] = []
        idle_since = time.monotonic()
        while len(out) < max_records and not self._caught_up():
            if time.monotonic() - self._refreshed > METADATA_REFRESH_SECONDS:
                self._assign(self._partitions())  # partitions added while running
            msgs = self.consumer.consume(num_messages=max_records - len(out), timeout=1.0)
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise SourceError(f"topic {m.topic()!r} partition {m.partition()}: {err.str()}")
                    continue
                out.append(self._record(m))
            if msgs:
                idle_since = time.monotonic()
                self._last_error = None
            elif time.monotonic() - idle_since > self.unavailable_timeout:
                detail = self._last_error.str() if self._last_error else "no data although the end offset is ahead"
                raise SourceError(self._unreachable(detail))
        return out

    def _record(self, m) -> SourceRecord:
        self._positions[stream_id(m.topic(), m.partition())] = m.offset() + 1
        return self._to_record(m)

    @staticmethod
    def _to_record(m) -> SourceRecord:
        """A confluent-kafka Message as a SourceRecord (the offset is also the sequence number)."""
        _, ts = m.timestamp()
        when = datetime.fromtimestamp(ts / 1000, tz=UTC) if ts and ts > 0 else datetime.now(UTC)
        return SourceRecord(
            m.topic(),
            m.partition(),
            str(m.offset()),
            m.offset(),
            when,
            m.key(),
            m.value(),
            tuple((k, v) for k, v in (m.headers() or [])),
        )

    def commit(self, positions: Mapping[str, int]) -> None:
        offsets = [
            TopicPartition(t, p, positions[stream_id(t, p)])
            for t, p in sorted(self._assigned)
            if stream_id(t, p) in positions
        ]
        if not offsets:
            return
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as e:  # tooling only: the Iceberg tables hold the truth
            log.warning("could not mirror positions to consumer group at %s: %s", self.where, e)

    def close(self) -> None:
        self.consumer.close()


__all__ = ["KafkaSource"]


class GroupOffsetsMirror:
    """Commits the consumer group's offsets (next offset to read) after each Iceberg commit."""

    def __init__(self, settings: Mapping[str, str], group_id: str):
        self.consumer = Consumer({**settings, "group.id": group_id, "enable.auto.commit": False})

    def update(self, last: Mapping[str, tuple[int, str]]) -> None:
        offsets = [
            TopicPartition(s.rsplit(":", 1)[0], int(s.rsplit(":", 1)[1]), seq + 1)
            for s, (seq, _) in sorted(last.items())
        ]
        if not offsets:
            return
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as e:  # tooling only: the Iceberg tables hold the truth
            log.warning("could not mirror positions to consumer group: %s", e)

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

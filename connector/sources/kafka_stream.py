"""Kafka as a PySpark Python streaming data source: executors read the partitions of a
micro-batch in parallel with confluent-kafka. Offsets are `{"topic:partition": next offset}`,
seeded from the Iceberg tables' positions (the `positions` option)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping

from confluent_kafka import Consumer, KafkaError, TopicPartition

from connector.core.config import starting_value
from connector.core.errors import SourceError
from connector.core.records import stream_id
from connector.sources.kafka import KafkaSource, initial_offset, retrying
from connector.sources.spark_stream import EVENT_SCHEMA, DataSource, DataSourceStreamReader, InputPartition, row_of

log = logging.getLogger(__name__)


class KafkaPartition(InputPartition):  # type: ignore[misc]
    def __init__(self, topic: str, partition: int, start: int, end: int):
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


class KafkaStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    def __init__(self, options: Mapping[str, str]):
        self.settings = json.loads(options["kafka_settings"])
        self.topics = json.loads(options["topics"])
        self.positions = json.loads(options.get("positions", "{}"))
        self.starting = starting_value(options.get("starting_position", "earliest"))
        self.fail_on_data_loss = options.get("fail_on_data_loss", "true") == "true"
        self.timeout = float(options.get("unavailable_timeout_seconds", "60"))
        self._consumer: Consumer | None = None

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer({**self.settings, "group.id": "cdclake-metadata", "enable.auto.commit": False})
        return self._consumer

    def _watermarks(self) -> dict[str, tuple[int, int]]:
        c = self._client()
        try:
            meta = c.list_topics(timeout=self.timeout)
        except Exception as e:  # noqa: BLE001 - KafkaException
            raise SourceError(f"Kafka at {self.settings.get('bootstrap.servers')} unreachable: {e}") from None
        out = {}
        for topic in self.topics:
            t = meta.topics.get(topic)
            if t is None or t.error is not None:
                raise SourceError(f"topic {topic!r} does not exist; create it or fix source.topics")
            for p in t.partitions:
                out[stream_id(topic, p)] = retrying(
                    lambda tp=TopicPartition(topic, p): c.get_watermark_offsets(tp, timeout=self.timeout),
                    self.timeout,
                    f"Kafka at {self.settings.get('bootstrap.servers')}: offsets of {topic}:{p}",
                )
        return out

    def initialOffset(self) -> dict:
        out = {}
        for stream, (low, high) in self._watermarks().items():
            start = self.positions.get(stream)
            if start is None:
                topic, part = stream.rsplit(":", 1)
                start = initial_offset(self._client(), topic, int(part), low, high, self.starting, self.timeout)
            elif start < low:
                topic, part = stream.rsplit(":", 1)
                msg = (
                    f"topic {topic!r} partition {part}: offsets [{start}, {low}) no longer exist in the source "
                    "(expired by retention or removed by compaction) and were never ingested"
                )
                if self.fail_on_data_loss:
                    raise SourceError(msg + f"; set source.fail_on_data_loss = false to continue from {low}")
                log.error("%s; continuing from %s", msg, low)
                start = low
            out[stream] = int(start)
        return out

    def latestOffset(self) -> dict:
        return {stream: int(high) for stream, (_, high) in self._watermarks().items()}

    def partitions(self, start: dict, end: dict) -> list:
        parts = []
        for stream, e in sorted(end.items()):
            topic, p = stream.rsplit(":", 1)
            s = int(start.get(stream, 0))  # a partition added while running starts at 0
            if int(e) > s:
                parts.append(KafkaPartition(topic, int(p), s, int(e)))
        return parts

    def read(self, partition: KafkaPartition) -> Iterator[tuple]:  # type: ignore[override]  # Spark passes ours
        c = Consumer(
            {**self.settings, "group.id": "cdclake-reader", "enable.auto.commit": False, "enable.partition.eof": True}
        )
        c.assign([TopicPartition(partition.topic, partition.partition, partition.start)])
        nxt = partition.start
        try:
            while nxt < partition.end:
                msgs = c.consume(num_messages=min(10_000, partition.end - nxt), timeout=self.timeout)
                if not msgs:
                    raise SourceError(
                        f"{partition.topic}:{partition.partition}: no data from offset {nxt} within "
                        f"{self.timeout:g}s although the batch ends at {partition.end}"
                    )
                for m in msgs:
                    error, offset = m.error(), m.offset()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            continue
                        raise SourceError(f"{partition.topic}:{partition.partition}: {error.str()}")
                    if offset is None or offset >= partition.end:
                        nxt = partition.end
                        break
                    nxt = offset + 1
                    yield row_of(KafkaSource._to_record(m))
        finally:
            c.close()

    def commit(self, end: dict) -> None:
        """Nothing to do: the Iceberg log table's snapshot summary is the checkpoint."""

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


class KafkaDataSource(DataSource):  # type: ignore[misc]
    @classmethod
    def name(cls) -> str:
        return "cdclake-kafka"

    def schema(self) -> str:
        return EVENT_SCHEMA

    def streamReader(self, schema) -> KafkaStreamReader:
        return KafkaStreamReader(self.options)

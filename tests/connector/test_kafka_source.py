"""The Kafka source against a real broker (infra/kafka_broker.py), through the ingest pipeline."""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from pydantic import TypeAdapter

from connector.app import run_ingest
from connector.core.errors import SourceError
from connector.core.source_config import SourceConfig
from iceberg.catalog import load_catalog
from tests.conftest import SASL_PASSWORD
from tests.iceberg.helpers import names

SOURCE = TypeAdapter(SourceConfig)

pytestmark = pytest.mark.kafka


def new_topic(kafka, partitions: int = 2, topic: str | None = None) -> str:
    topic = topic or f"pg.inventory.t{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})  # kept alive until the futures resolve
    for f in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        f.result(30)
    return topic


def produce(kafka, topic: str, events: list[tuple[int, int, str | None]]) -> None:
    """(partition, key id, op or None for a tombstone) as Debezium JSON, in order per partition."""
    p = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for i, (part, key, op) in enumerate(events):
        value = (
            None
            if op is None
            else json.dumps(
                {
                    "op": op,
                    "after": None if op == "d" else {"id": key, "n": i},
                    "source": {"connector": "postgresql", "table": topic.rsplit(".", 1)[1], "lsn": 100 + i},
                }
            )
        )
        p.produce(topic, key=json.dumps({"id": key}), value=value, partition=part)
    p.flush(30)


def kafka_settings(settings, kafka, topic: str, **source):
    conf = {
        "type": "kafka",
        "bootstrap_servers": kafka.bootstrap,
        "topics": [topic],
        "batch_size": 4,
        "unavailable_timeout_seconds": 15,
        "group_id": f"g-{topic}",
    } | source
    return settings.model_copy(update={"source": SOURCE.validate_python(conf)})


def log_positions(s, table: str) -> list[tuple[int, int]]:
    t = load_catalog(s).load_table(names(s, table).log)
    return sorted(
        (r["partition"], r["sequence_number"])
        for r in t.scan(selected_fields=("partition", "sequence_number")).to_arrow().to_pylist()
    )


def test_kafka_ingest_is_exactly_once_and_mirrors_group_offsets(settings, kafka):
    topic = new_topic(kafka)
    table = topic.rsplit(".", 1)[1]
    produce(kafka, topic, [(0, 1, "c"), (1, 2, "c"), (0, 1, "d"), (0, 1, None), (1, 2, "u")])
    s = kafka_settings(settings, kafka, topic)
    assert run_ingest(s).accepted[table] == 5
    assert run_ingest(s).records == 0  # nothing new: the table's positions say so
    produce(kafka, topic, [(1, 3, "c")])
    assert run_ingest(s).accepted[table] == 1
    assert log_positions(s, table) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"g-{topic}"})
    committed = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    c.close()
    assert [tp.offset for tp in committed] == [3, 3]


def test_headers_reach_the_log_as_kafka_gives_them(spark, settings, kafka):
    topic = new_topic(kafka, 1)
    table = topic.rsplit(".", 1)[1]
    headers = [("trace", b"\xff\x00"), ("trace", b"second"), ("empty", None)]
    value = {"op": "c", "after": {"id": 1}, "source": {"connector": "postgresql", "table": table, "lsn": 1}}
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    p.produce(topic, key=b'{"id":1}', value=json.dumps(value), headers=headers)
    p.produce(topic, key=b'{"id":1}', value=b"{not json", headers=headers)
    p.flush(30)
    s = kafka_settings(settings, kafka, topic)
    run_ingest(s)
    n = names(s, table)
    for name in (n.log, n.dead_letters):
        (row,) = spark.table(f"{s.catalog.name}.{name}").collect()
        assert [(h["key"], h["value"]) for h in row["headers"]] == headers


def _spark_kafka_consumers(spark, group: str, topic: str, partitions: int) -> tuple[int, int]:
    """(consumers Spark's executor pool holds in all, those of `group` for the topic): the
    pool is private to Spark's Kafka source, so it is read by reflection."""
    gateway, jvm = spark.sparkContext._gateway, spark.sparkContext._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()

    def cls(name: str):
        return jvm.java.lang.Class.forName(f"org.apache.spark.sql.kafka010.consumer.{name}", True, loader)

    field = cls("KafkaDataConsumer$").getDeclaredField("consumerPool")
    field.setAccessible(True)
    pool = field.get(None)
    args = gateway.new_array(jvm.java.lang.Class, 2)
    args[0], args[1] = (
        jvm.java.lang.String._java_lang_class,
        jvm.org.apache.kafka.common.TopicPartition._java_lang_class,
    )
    make = cls("KafkaDataConsumer$CacheKey").getConstructor(args)
    ours = 0
    for p in range(partitions):
        values = gateway.new_array(jvm.java.lang.Object, 2)
        values[0], values[1] = group, jvm.org.apache.kafka.common.TopicPartition(topic, p)
        ours += pool.size(make.newInstance(values))
    return pool.size(), ours


@pytest.mark.spark
def test_a_backlog_read_in_many_batches_keeps_one_consumer_per_partition(spark, settings, kafka):
    """Spark pools its Kafka consumers (and what they prefetched) by group id and partition
    for minutes: each batch reads with the source's group id, so a backlog drained in many
    batches reuses one consumer per partition instead of adding one per partition per batch
    (the pool may evict older, idle consumers meanwhile: the growth is a bound)."""
    topic = new_topic(kafka, 2)
    produce(kafka, topic, [(i % 2, i, "c") for i in range(24)])
    s = kafka_settings(settings, kafka, topic)
    before, _ = _spark_kafka_consumers(spark, s.source.group_id, topic, 2)
    assert run_ingest(s).batches == 6
    after, ours = _spark_kafka_consumers(spark, s.source.group_id, topic, 2)
    assert ours == 2 and after - before <= 2


@pytest.mark.spark
def test_a_batch_over_many_partitions_is_read_in_few_tasks_each_record_once(spark, settings, kafka):
    """A batch over more partitions than twice the cores reads them in that many tasks (each
    task is a Python worker's turn); every record reaches the log once, at its position."""
    from connector.sources.kafka import KafkaSource

    topic = new_topic(kafka, 12)
    produce(kafka, topic, [(i % 12, i, "c") for i in range(36)])
    s = kafka_settings(settings, kafka, topic, batch_size=1000)
    source = KafkaSource(s.source)
    try:
        source.seek({})
        tasks = source.next_frame(spark, 1000).rdd.getNumPartitions()
    finally:
        source.close()
    assert tasks <= 2 * spark.sparkContext.defaultParallelism < 12
    assert run_ingest(s).batches == 1
    assert log_positions(s, topic.rsplit(".", 1)[1]) == [(p, o) for p in range(12) for o in range(3)]


def event_hubs_endpoint(kafka) -> dict:
    """Event Hubs' Kafka endpoint as the local broker's SASL listener plays it."""
    return {
        "type": "eventhubs-kafka",
        "namespace": "cdclake-test",
        "connection_string": SASL_PASSWORD,
        "bootstrap_servers": kafka.sasl_bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
    }


def test_event_hubs_kafka_endpoint_sasl_plain(settings, kafka):
    topic = new_topic(kafka, 1)
    produce(kafka, topic, [(0, 1, "c"), (0, 2, "c")])
    eh = event_hubs_endpoint(kafka)
    s = kafka_settings(settings, kafka, topic, **eh)
    assert s.source.kafka_settings()["sasl.username"] == "$ConnectionString"
    assert run_ingest(s).accepted[topic.rsplit(".", 1)[1]] == 2
    bad = kafka_settings(
        settings,
        kafka,
        topic,
        **(eh | {"connection_string": SASL_PASSWORD.replace("s3cr3t", "wrong"), "unavailable_timeout_seconds": 5}),
    )
    with pytest.raises(SourceError) as e:
        run_ingest(bad.model_copy(update={"catalog": bad.catalog.model_copy(update={"namespace": "sasl_bad"})}))
    assert "wrong" not in str(e.value) and "s3cr3t" not in str(e.value) and kafka.sasl_bootstrap in str(e.value)


def test_the_sasl_secret_stays_out_of_plans_logs_errors_and_the_event_log(spark, settings, kafka, work_root, capfd):
    """The connection string is the SASL password: Spark's plans, the event log, the logs (the
    JVM's and Python's), errors and reprs never show it."""
    from connector.sources.kafka import KafkaSource

    topic = new_topic(kafka, 1)
    produce(kafka, topic, [(0, 1, "c")])
    eh = event_hubs_endpoint(kafka)
    s = kafka_settings(settings, kafka, topic, **eh)
    secret = "s3cr3t"
    with KafkaSource(s.source) as source:
        source.seek({})
        frame = source.next_frame(spark, 10)
        plans = frame._jdf.queryExecution().toString()  # parsed, analysed, optimised and physical
        assert "LoginModule" not in plans and secret not in plans
        assert secret not in repr(source) and secret not in repr(s)
    assert run_ingest(s).accepted[topic.rsplit(".", 1)[1]] == 1
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    logs = [p for p in (work_root / "spark-events").rglob("*") if p.is_file()]
    events = "".join(p.read_text(errors="replace") for p in logs)
    assert "sasl.jaas.config" in events or "kafka" in events  # the log holds the run
    assert secret not in events
    out, err = capfd.readouterr()
    assert secret not in out and secret not in err


def test_partitions_added_between_runs_are_read(settings, kafka):
    topic = new_topic(kafka, 1)
    table = topic.rsplit(".", 1)[1]
    produce(kafka, topic, [(0, 1, "c")])
    s = kafka_settings(settings, kafka, topic)
    run_ingest(s)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for f in admin.create_partitions([NewPartitions(topic, 2)]).values():
        f.result(30)
    produce(kafka, topic, [(1, 2, "c")])
    run_ingest(s)
    assert log_positions(s, table) == [(0, 0), (1, 0)]


def produced_positions(events: list[tuple[int, int, str | None]]) -> list[tuple[int, int]]:
    """The (partition, offset) of each event `produce` wrote to a new topic."""
    count: dict[int, int] = {}
    out = []
    for part, _, _ in events:
        out.append((part, count.get(part, 0)))
        count[part] = count.get(part, 0) + 1
    return sorted(out)


def test_a_topics_pattern_reads_the_matching_topics_and_those_created_while_running(settings, kafka):
    """`topics_pattern`: the topics whose whole name matches are ingested into their tables,
    the others are not; a topic created after the first batch is read by a later batch of
    the same run, and one created between runs by the next run."""
    prefix = f"re{uuid.uuid4().hex[:8]}"
    s = kafka_settings(settings, kafka, "", topics=None, topics_pattern=rf"{prefix}\.inventory\.[a-z]+")
    assert s.source.topics is None and run_ingest(s).records == 0  # nothing matches yet: no error

    produced = {
        "customers": [(0, 1, "c"), (1, 2, "c"), (0, 1, "u"), (1, 3, "c"), (0, 4, "c")],
        "orders": [(0, 10, "c"), (0, 11, "c"), (0, 10, "d"), (0, 10, None)],
    }
    for table, events in produced.items():
        new_topic(kafka, 2, f"{prefix}.inventory.{table}")
        produce(kafka, f"{prefix}.inventory.{table}", events)
    for other in (f"{prefix}.inventory.customers_old", f"{prefix}.audit.events"):  # the whole name must match
        new_topic(kafka, 1, other)
        produce(kafka, other, [(0, 1, "c"), (0, 2, "c")])

    created_after: list[int] = []

    def create_items(stats) -> None:
        if not created_after:  # after the first batch: a topic the run did not see at its start
            created_after.append(stats.batches)
            produced["items"] = [(0, 20, "c"), (0, 21, "c"), (0, 20, "u")]
            new_topic(kafka, 1, f"{prefix}.inventory.items")
            produce(kafka, f"{prefix}.inventory.items", produced["items"])

    stats = run_ingest(s, on_batch=create_items)  # batch_size 4: 9 records at the start, 3 batches at least
    assert created_after == [1]
    assert {t: n for t, n in stats.accepted.items() if n} == {t: len(e) for t, e in produced.items()}
    for table, events in produced.items():
        assert log_positions(s, table) == produced_positions(events)
    catalog = load_catalog(s)
    assert not catalog.table_exists(names(s, "customers_old").log)
    assert not catalog.table_exists(names(s, "events").log)

    parts = [(0, 30, "c"), (1, 31, "c")]
    new_topic(kafka, 2, f"{prefix}.inventory.parts")
    produce(kafka, f"{prefix}.inventory.parts", parts)
    produce(kafka, f"{prefix}.inventory.customers", [(1, 5, "c")])
    stats = run_ingest(s)
    assert {t: n for t, n in stats.accepted.items() if n} == {"parts": 2, "customers": 1}
    assert log_positions(s, "parts") == produced_positions(parts)
    assert log_positions(s, "customers") == produced_positions([*produced["customers"], (1, 5, "c")])
    assert not catalog.table_exists(names(s, "customers_old").log)


def test_offsets_that_no_longer_exist_are_reported(settings, kafka):
    topic = new_topic(kafka, 1)
    table = topic.rsplit(".", 1)[1]
    produce(kafka, topic, [(0, 1, "c"), (0, 2, "c")])
    s = kafka_settings(settings, kafka, topic)
    run_ingest(s, max_records=1)  # offset 0 committed, offset 1 not yet
    produce(kafka, topic, [(0, 3, "c")])
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for f in admin.delete_records([TopicPartition(topic, 0, 2)]).values():  # retention removed offsets 0-1
        f.result(30)
    with pytest.raises(SourceError, match=r"partition 0: offsets \[1, 2\) no longer exist"):
        run_ingest(s)
    lenient = kafka_settings(settings, kafka, topic, fail_on_data_loss=False)
    run_ingest(lenient)
    assert log_positions(s, table) == [(0, 0), (0, 2)]


def test_broker_down_fails_clearly_and_the_rerun_resumes(settings, kafka):
    topic = new_topic(kafka, 1)
    table = topic.rsplit(".", 1)[1]
    produce(kafka, topic, [(0, 1, "c"), (0, 2, "c")])
    s = kafka_settings(settings, kafka, topic, unavailable_timeout_seconds=4)
    run_ingest(s, max_records=1)
    kafka.stop()
    try:
        with pytest.raises(SourceError, match=r"unreachable for 4s.*committed positions are safe") as e:
            run_ingest(s)
        assert kafka.bootstrap in str(e.value)
    finally:
        kafka.start()
    run_ingest(s)
    assert log_positions(s, table) == [(0, 0), (0, 1)]


@pytest.mark.parametrize("start,expected", [(1, [(0, 1), (0, 2)]), ("latest", [])])
def test_starting_position_for_new_partitions(settings, kafka, start, expected):
    topic = new_topic(kafka, 1)
    table = topic.rsplit(".", 1)[1]
    produce(kafka, topic, [(0, 1, "c"), (0, 2, "c"), (0, 3, "c")])
    s = kafka_settings(settings, kafka, topic, starting_position=start)
    run_ingest(s)
    exists = load_catalog(s).table_exists(names(s, table).log)
    assert (log_positions(s, table) if exists else []) == expected


@pytest.mark.spark
@pytest.mark.slow
def test_a_broker_outage_through_the_cli_is_one_line_without_third_party_output(settings, kafka, tmp_path):
    """`cdclake ingest` in its own process with the broker down: exit 1, and everything it
    prints (stdout and stderr: Spark's, the JVM's, librdkafka's) is the one error line."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    topic = new_topic(kafka, 1)
    produce(kafka, topic, [(0, 1, "c")])
    env = {
        **os.environ,
        "CDCLAKE_WORK_DIR": str(tmp_path / "lake"),
        "CDCLAKE_SOURCE__TYPE": "kafka",
        "CDCLAKE_SOURCE__BOOTSTRAP_SERVERS": kafka.bootstrap,
        "CDCLAKE_SOURCE__TOPICS": json.dumps([topic]),
        "CDCLAKE_SOURCE__UNAVAILABLE_TIMEOUT_SECONDS": "5",
    }
    kafka.stop()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "connector.cli", "ingest"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=Path(__file__).resolve().parents[2],
        )
    finally:
        kafka.start()
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, lines[:40]
    assert lines[0].startswith("error: ") and "unreachable for 5s" in lines[0] and kafka.bootstrap in lines[0]

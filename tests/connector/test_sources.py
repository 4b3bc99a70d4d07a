"""Pure parts of the sources: how a batch is shared among partitions, and the Java Kafka
client's settings made from librdkafka's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connector.sources import share
from connector.sources.kafka import read_options, spark_kafka_options


@given(st.dictionaries(st.text(min_size=1, max_size=3), st.integers(-5, 10_000), max_size=8), st.integers(1, 5_000))
def test_a_batch_shares_its_events_among_the_partitions_in_proportion_to_their_lag(lags, max_events):
    got = share(lags, max_events)
    waiting = {s: n for s, n in lags.items() if n > 0}
    assert set(got) == set(waiting)  # every partition with events waiting moves
    assert all(1 <= got[s] <= waiting[s] for s in got)  # never past what is waiting
    if sum(waiting.values()) <= max_events:
        assert got == waiting
    else:  # about max_events in all: each share rounds down, but is at least one
        assert sum(got.values()) <= max_events + len(got)


@pytest.mark.parametrize(
    "settings, expected",
    [
        (
            {"bootstrap.servers": "b:9092", "security.protocol": "PLAINTEXT"},
            {"kafka.bootstrap.servers": "b:9092", "kafka.security.protocol": "PLAINTEXT"},
        ),
        (
            {
                "bootstrap.servers": "ns.servicebus.windows.net:9093",
                "security.protocol": "SASL_SSL",
                "sasl.mechanisms": "PLAIN",
                "sasl.username": "$ConnectionString",
                "sasl.password": 'Endpoint=sb://x/;K="q\\',
            },
            {
                "kafka.bootstrap.servers": "ns.servicebus.windows.net:9093",
                "kafka.security.protocol": "SASL_SSL",
                "kafka.sasl.mechanism": "PLAIN",
                "kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
                'username="$ConnectionString" password="Endpoint=sb://x/;K=\\"q\\\\";',
            },
        ),
        (
            {
                "bootstrap.servers": "b:9092",
                "sasl.mechanisms": "SCRAM-SHA-512",
                "sasl.username": "u",
                "sasl.password": "p",
                "client.id": "c",
            },
            {
                "kafka.bootstrap.servers": "b:9092",
                "kafka.client.id": "c",
                "kafka.sasl.mechanism": "SCRAM-SHA-512",
                "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
                'username="u" password="p";',
            },
        ),
    ],
)
def test_librdkafka_settings_become_the_java_clients(settings, expected):
    assert spark_kafka_options(settings) == expected


def test_every_kafka_read_shares_the_group_and_fetches_in_large_chunks_unless_told_otherwise():
    plain = read_options("cdclake-g", {"bootstrap.servers": "127.0.0.1:1"}, fail_on_data_loss=True)
    assert plain["kafka.group.id"] == "cdclake-g" and plain["failOnDataLoss"] == "true"
    assert plain["kafka.max.partition.fetch.bytes"] == str(8 << 20) and plain["kafka.receive.buffer.bytes"] == "-1"
    told = read_options("g", {"max.partition.fetch.bytes": "1048576"}, fail_on_data_loss=False)
    assert told["kafka.max.partition.fetch.bytes"] == "1048576" and told["failOnDataLoss"] == "false"

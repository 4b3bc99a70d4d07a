"""The fuzzed stream of tests/connector/test_fuzz.py through ingest (real pyiceberg tables)
and a compaction of every table it made (the shared Spark session): nothing crashes, every
record is in exactly one log or dead-letter table with its bytes, and no table is blocked."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from connector.core.records import ChangeEvent
from connector.debezium import Decoder
from connector.pipeline import IngestJob, ingest
from iceberg.catalog import load_catalog
from iceberg.layouts import source_tables
from tests.connector.test_fuzz import mutate, record, samples
from tests.iceberg.helpers import compact_table, offsets_by_key
from tests.list_source import ListSource
from tests.model import expected_tables

pytestmark = pytest.mark.spark


def test_a_fuzzed_stream_ingests_and_compacts_without_losing_or_blocking_anything(spark, settings, fixtures):
    rng = random.Random(7)
    base = samples(fixtures)
    postgres = [s for s in base if b'"postgresql"' in s[1]]
    records = []
    for i in range(1500):
        table, raw = rng.choice(postgres if rng.random() < 0.5 else base)
        value = mutate(rng, raw) if rng.random() < 0.4 else raw
        records.append(
            record(i, f"srv.inventory.{table}", b'{"id":%d}' % rng.randrange(40), value, partition=rng.randrange(2))
        )
    catalog, ns = load_catalog(settings), settings.catalog.namespace
    for _ in range(2):  # the second run finds everything held
        ingest(spark, ListSource(records), IngestJob(catalog, ns, Decoder({"customers": ["id"]}), 400))
    names = [n for _, n in catalog.list_tables(ns)]
    held: Counter = Counter()
    for name in names:
        if name.endswith(("__log", "__dead_letters")):
            for r in catalog.load_table((ns, name)).scan().to_arrow().to_pylist():
                held[(r["topic"], r["partition"], r["sequence_number"])] += 1
                assert r["value"] == records[r["sequence_number"]].value
    assert held == Counter({(r.topic, r.partition, r.sequence_number): 1 for r in records})
    tables = source_tables(names)
    assert len(tables) >= 2
    decoder = Decoder({"customers": ["id"]})
    events = [e for e in map(decoder.decode, records) if isinstance(e, ChangeEvent)]
    for table in tables:  # every table compacts; what a table cannot hold is a dead letter, not a failure
        report = compact_table(spark, settings, table, packed=False)  # small rounds, as in production
        assert report.events > 0
        state, tombstones = expected_tables([e for e in events if e.table == table], "source")
        got = offsets_by_key(settings, f"{ns}.{table}")
        if report.refused:  # a refused winner's key keeps what it held (here: nothing)
            assert all(state.get(k) == offset for k, offset in got.items()), table
        else:
            assert got == state, table
            assert offsets_by_key(settings, f"{ns}.{table}__tombstones") == tombstones, table

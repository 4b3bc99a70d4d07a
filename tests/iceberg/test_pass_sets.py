"""A pass's small rounds read together in chunks: a chunk's read begins as soon as its rounds are
planned, while the pass plans the next ones; each table ends as the model says."""

from __future__ import annotations

import threading

import pytest

from connector.app import run_compaction
from iceberg.compaction import job, shared
from tests.iceberg.helpers import NOW, decoded, run_ingest
from tests.iceberg.test_many_tables import _lake
from tests.iceberg.test_property import assert_matches_model

pytestmark = pytest.mark.spark


def test_a_chunk_is_read_while_the_next_rounds_are_planned(spark, settings, monkeypatch):
    """Six tables in chunks of two: the last round's plan waits for a chunk's read to begin,
    which it does only if reads begin before the planning ends. The chunks hold each table
    once, and every table equals the model."""
    tables = [f"c{i}" for i in range(6)]
    s, path = _lake(settings, tables, "chunks")
    run_ingest(s)
    begin, read = job.Round.begin, shared.read_chunk
    reading, plans, chunks, waited = threading.Event(), [], [], []

    def planned(r, *args, **kwargs):
        plans.append(r.names.table)
        if len(plans) == len(tables):
            waited.append(reading.wait(60))
        return begin(r, *args, **kwargs)

    def read_chunk(session, rounds, chunk):
        chunks.append([rounds[i].names.table for i in chunk])
        reading.set()
        return read(session, rounds, chunk)

    monkeypatch.setattr(job.Round, "begin", planned)
    monkeypatch.setattr(shared, "read_chunk", read_chunk)
    monkeypatch.setattr(shared, "READ_CHUNKS", 3)
    assert all(r.ran for r in run_compaction(s, force=True, now=NOW))
    assert waited == [True], "no chunk's read began while the pass planned its rounds"
    assert sorted(t for c in chunks for t in c) == tables
    assert [len(c) for c in chunks] == [2, 2, 2]
    events = decoded(path, s)
    for t in tables:
        assert_matches_model(s, t, events, [len(events)], "source")

"""Random streams, ingested in random batch splits with compactions in between, end with
the state and tombstones of the plain-Python model of the contract (tests/model.py)."""

from __future__ import annotations

import itertools
import json
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings as hsettings, strategies as st

from iceberg.catalog import load_catalog
from iceberg.maintenance import MaintenancePolicy
from tests.iceberg.helpers import compact_table, decoded, names, offsets_by_key, run_ingest, with_source, write_lines
from tests.model import expected_tables, survivors

pytestmark = pytest.mark.spark
_ns = itertools.count()
EAGER = MaintenancePolicy(snapshot_retention=timedelta(0), rewrite_files=1, expire_batch=1)

event = st.tuples(
    st.integers(0, 3),  # key; its partition is key % 2, as a partitioner would place it
    st.sampled_from(["c", "u", "u", "d", "r"]),
    st.integers(1, 8),  # source position (lsn): collisions and stale events on purpose
    st.booleans(),  # a delete is followed by its bare tombstone
)


def to_lines(stream) -> list[str]:
    offsets = [0, 0]
    lines = []
    for key, op, lsn, tombstone in stream:
        part = key % 2
        source = {"connector": "postgresql", "table": "things", "lsn": lsn, "snapshot": "true" if op == "r" else "false"}
        values = [json.dumps({"op": op, "before": None, "after": None if op == "d" else {"id": key, "lsn": lsn},
                              "source": source})]
        if op == "d" and tombstone:
            values.append(None)
        for v in values:
            lines.append(json.dumps({"topic": "db.s.things", "partition": part, "offset": offsets[part],
                                     "ts": 1_700_000_000_000 + len(lines), "key": json.dumps({"id": key}),
                                     "payload": v}))
            offsets[part] += 1
    return lines


@hsettings(max_examples=12, deadline=None, derandomize=True,
           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(stream=st.lists(event, min_size=1, max_size=25), cuts=st.lists(st.integers(1, 40), max_size=2),
       ordering=st.sampled_from(["source", "log"]), packed=st.booleans(), maintain=st.booleans())
# a delete and its bare tombstone in one round: the tombstone wins and carries the delete's position
@example(stream=[(0, "c", 1, False), (0, "d", 2, True)], cuts=[], ordering="source", packed=True, maintain=False)
def test_random_stream_in_random_batches_matches_the_model(spark, settings, stream, cuts, ordering, packed, maintain):
    """`packed`: the packed order key where a round fits (as in production), else the general
    route (the window) for every round. `maintain`: after every round, a table with more than
    one data file is rewritten and every snapshot that may go is expired (later rounds find
    their cleaner points after that)."""
    lines = to_lines(stream)
    path = write_lines(Path(tempfile.mkdtemp()) / "in.jsonl", lines)
    s = with_source(settings.model_copy(update={"catalog": settings.catalog.model_copy(
        update={"namespace": f"{settings.catalog.namespace}_p{next(_ns)}"})}), path, ordering=ordering)
    bounds = sorted({c for c in cuts if c < len(lines)}) + [len(lines)]
    done = 0
    for b in bounds:
        run_ingest(s, max_records=b - done)
        done = b
        report = compact_table(spark, s, "things", packed=packed, maintenance=EAGER if maintain else None)
        assert not [a for a in report.maintenance if a.startswith("failed")], report.maintenance  # best effort: logged
    events = decoded(path, s)
    state, tombs = expected_tables(events, ordering)
    assert offsets_by_key(s, names(s, "things").state) == state
    assert offsets_by_key(s, names(s, "things").tombstones) == tombs
    # the stored source positions too: a later round compares new events with them
    catalog, t = load_catalog(s), names(s, "things")
    stored = {r["_key"]: (None if r["_source_position"] is None else tuple(r["_source_position"]))
              for name in (t.state, t.tombstones)
              for r in catalog.load_table(name).scan(selected_fields=("_key", "_source_position")).to_arrow().to_pylist()}
    assert stored == {k: position for k, (_, _, position) in survivors(events, ordering).items()}

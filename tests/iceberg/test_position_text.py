"""The state's and tombstones' source position as text (`_source_position_text`), which the
lookup of a round's held rows reads, and tables made before that column, which read the list
(shared local Spark session, real Iceberg tables)."""

from __future__ import annotations

import dataclasses

import pytest

from connector.app import policy_of
from iceberg.catalog import load_catalog
from iceberg.verify import rebuild
from tests.iceberg.helpers import (
    NOW,
    compact_table,
    decoded,
    kline,
    names,
    offsets_by_key,
    pg,
    run_ingest,
    with_source,
    write_lines,
)
from tests.model import expected_tables

pytestmark = pytest.mark.spark


def test_a_source_position_read_back_from_its_text_is_the_same_list(spark):
    """`_source_position_text` (what the held-rows lookup reads) gives back every position as
    it was: any number of elements, either sign, the 64-bit bounds, empty, none."""
    from pyspark.sql import functions as F

    from iceberg.compaction.dedupe import POSITION_TYPE, position_from_text, position_text

    given = [None, [], [0], [7], [-1, 5], [-(2**63), 2**63 - 1, 0], [10**18, 3, 2]]
    frame = spark.createDataFrame([(i, p) for i, p in enumerate(given)], f"i int, p {POSITION_TYPE}")
    rows = frame.select("i", position_text(F.col("p")).alias("t")).select("i", "t", position_from_text(F.col("t")))
    got = {i: (t, back) for i, t, back in rows.collect()}
    assert got == {i: (None if p is None else ",".join(map(str, p)), p) for i, p in enumerate(given)}


@pytest.mark.parametrize("made_before", [False, True], ids=["position-as-text", "table-made-before-the-text"])
@pytest.mark.parametrize("packed", [False, True], ids=["small-rounds-by-position", "merge"])
def test_held_rows_keep_their_position_whichever_way_the_table_holds_it(
    spark, settings, tmp_path, monkeypatch, made_before, packed
):
    """Later rounds judge late changes against the positions the state and tombstones hold:
    read from `_source_position_text`, or from the list in a table made before that column,
    which keeps its columns, through a rebuild too. Both end as the model, and where the text
    is there, it is every row's position."""
    from iceberg.compaction import schema
    from iceberg.layouts import META_COLUMNS, POSITION_TEXT

    s = with_source(settings, tmp_path / "in.jsonl")
    t = names(s, "things")
    if made_before:
        monkeypatch.setattr(schema, "META_COLUMNS", [c for c in META_COLUMNS if c[0] != POSITION_TEXT])
        schema.ensure_tables(spark, t)
        monkeypatch.undo()
    offsets, lines = [0, 0], []

    def add(key: int, op: str, lsn: int) -> None:
        part = key % 2
        lines.append(kline(part, offsets[part], key, pg(op, key, lsn), lsn))
        offsets[part] += 1
        if op == "d":
            lines.append(kline(part, offsets[part], key, None, lsn))
            offsets[part] += 1

    rounds = [
        [(k, "c", 1000 + k) for k in range(30)],
        # older than held (stale), newer, deletes, a new key
        [(k, "u", 500 + k) for k in range(10)]
        + [(k, "u", 2000 + k) for k in range(10, 20)]
        + [(k, "d", 2100 + k) for k in range(20, 25)]
        + [(30, "c", 2200)],
        # re-created after the delete's position (wins) and before it (stale against the tombstone)
        [(20, "c", 3000), (21, "c", 2000), (0, "u", 3100), (1, "u", 900)],
    ]
    for changes in rounds:
        for change in changes:
            add(*change)
        write_lines(tmp_path / "in.jsonl", lines)
        run_ingest(s)
        compact_table(spark, s, "things", packed=packed)
        state, tombstones = expected_tables(decoded(tmp_path / "in.jsonl", s), "source")
        assert (offsets_by_key(s, t.state), offsets_by_key(s, t.tombstones)) == (state, tombstones)
    catalog = load_catalog(s)
    rebuild(spark, catalog, t, dataclasses.replace(policy_of(s), log_retention=None), NOW)  # keeps the layout
    assert (offsets_by_key(s, t.state), offsets_by_key(s, t.tombstones)) == (state, tombstones)
    for name in (t.state, t.tombstones):
        rows = catalog.load_table(name).scan().to_arrow().to_pylist()
        assert rows and (POSITION_TEXT in rows[0]) is not made_before, name
        if not made_before:
            assert all(r[POSITION_TEXT] == ",".join(map(str, r["_source_position"])) for r in rows), name

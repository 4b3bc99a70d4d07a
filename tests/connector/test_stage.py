"""The ingest stage without Spark: what a task writes and what it tells the driver, checked
against the input records computed another way; the byte scans it relies on against Python."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from connector.arrow_json import byte_counts
from connector.debezium import Decoder
from connector.sources.file import FileSource, _objects_or_blank, plan_ranges
from connector.stage import Quotas, StageContext, write_stage
from iceberg import compat
from iceberg.catalog import load_catalog
from iceberg.layouts import DEAD_LETTER_SCHEMA, LOG_SCHEMA
from iceberg.log_writer import DataFileWriter, FileTarget, commit_data_files, upgrade
from tests.conftest import kcat_lines

NOW = datetime(2030, 1, 1, tzinfo=UTC)


@given(st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=30), st.integers(0, 5), st.booleans())
def test_byte_counts_count_each_values_bytes(values, cut, large):
    array = pa.array(values, pa.large_binary() if large else pa.binary()).slice(min(cut, len(values)))
    want = [0 if v is None else v.count(b"[") + v.count(b"{") for v in values[min(cut, len(values)) :]]
    assert byte_counts(array, b"[{").tolist() == want


@pytest.mark.parametrize(
    "data, ok",
    [
        (b'{"a":1}\n{"b":2}\n', True),
        (b'{"a":1}\n\n{"b":2}', True),  # a blank line, no final line end
        (b'\n{"a":1}\n', True),
        (b'{"a":1}\nnull\n', False),  # Arrow's reader crashes on a bare null
        (b'null\n{"a":1}\n', False),
        (b'{"a":1}\n [1]\n', False),
        (b'{"a":1}\r\n{"b":2}\r\n', True),
    ],
)
def test_a_range_takes_the_arrow_reader_only_when_every_line_is_an_object(data, ok):
    assert _objects_or_blank(data) == ok


def _lines(n: int, partition: int) -> list[str]:
    values = [
        json.dumps({"op": "c", "after": {"id": i, "v": i * 10}, "source": {"connector": "postgresql", "table": "t"}})
        for i in range(n)
    ]
    values[3] = "{not json"
    return kcat_lines("db.public.t", values, [{"id": i} for i in range(n)], partition=partition)


def test_a_task_writes_its_fresh_rows_per_stream_and_summarises_them(tmp_path, settings):
    """Two streams interleaved in a dump, the first five records of partition 0 already in the
    log: the log gets every other change, dead letters the bad ones, and each summary agrees
    with the input counted in Python."""
    p0, p1 = _lines(12, 0), _lines(7, 1)
    lines = [x for pair in zip(p0, p1) for x in pair] + p0[len(p1) :]
    dump = tmp_path / "dump.jsonl"
    dump.write_text("\n".join(lines) + "\n")
    catalog, ns = load_catalog(settings), settings.catalog.namespace
    catalog.create_namespace_if_not_exists(ns)
    log = catalog.create_table((ns, "t__log"), schema=LOG_SCHEMA)
    source = FileSource(dump)
    source.seek({})
    floors = {"t__log": {"db.public.t:0": 5}}
    ctx = StageContext(Decoder(), floors, Quotas(None), NOW, source.expand(), {"t__log": FileTarget.of(log)})
    ctx.new_target = lambda sink: FileTarget.new(log.io, f"{log.location()}-{sink}", DEAD_LETTER_SCHEMA)
    ranges = pa.Table.from_pylist([vars(r) for r in plan_ranges(dump, max_lines=5)])
    assert ranges.num_rows > 2  # several batches of ranges: each stream's file goes on across them
    out = pa.Table.from_batches(list(write_stage(ctx, ranges.to_batches(max_chunksize=2)))).to_pylist()

    got = {(r["sink"], r["partition"]): r for r in out}
    assert set(got) == {("t__log", 0), ("t__log", 1), ("t__dead_letters", 0), ("t__dead_letters", 1)}
    for p, src in ((0, p0), (1, p1)):
        records = [json.loads(x) for x in src]
        good = [r for r in records if not r["payload"].startswith("{not")]
        fresh = [r for r in good if r["offset"] >= floors["t__log"].get(f"db.public.t:{p}", 0)]
        s = got[("t__log", p)]
        assert (s["n"], s["fresh_n"]) == (len(good), len(fresh))
        assert s["bytes"] == sum(len(r["key"]) + len(r["payload"]) for r in fresh)
        assert (s["first"], s["last"], s["last_offset"]) == (
            fresh[0]["offset"],
            good[-1]["offset"],
            str(good[-1]["offset"]),
        )
        assert s["routed"] is True
        d = got[("t__dead_letters", p)]
        assert (d["n"], d["fresh_n"], json.loads(d["reasons"])) == (1, 1, {"json": 1})
        assert json.loads(d["examples"])[0][:2] == ["3", "json"]

    files = [r["files"] for r in out if r["sink"] == "t__log"]
    commit_data_files(log, files, {}, "main")
    rows = (
        catalog.load_table((ns, "t__log"))
        .scan()
        .to_arrow()
        .sort_by([("partition", "ascending"), ("sequence_number", "ascending")])
    )
    want = [(p, r["offset"]) for p, src in ((0, p0), (1, p1)) for r in map(json.loads, src)]
    want = [(p, o) for p, o in want if o != 3 and o >= (5 if p == 0 else 0)]
    assert list(zip(rows["partition"].to_pylist(), rows["sequence_number"].to_pylist())) == want
    letters = compat.decode_data_files(got[("t__dead_letters", 0)]["files"])
    assert [f.record_count for f in letters] == [1]


def test_the_writer_keeps_null_lists_and_fills_an_older_tables_columns(settings):
    catalog, ns = load_catalog(settings), settings.catalog.namespace
    catalog.create_namespace_if_not_exists(ns)
    old = LOG_SCHEMA.set(LOG_SCHEMA.get_field_index("headers"), pa.field("headers", pa.string()))
    table = upgrade(catalog.create_table((ns, "old__log"), schema=old), LOG_SCHEMA)  # headers_json + headers
    row = {
        "topic": "a",
        "partition": 0,
        "offset": "0",
        "sequence_number": 0,
        "enqueued_time": NOW,
        "op": "c",
        "snapshot": False,
        "tombstone": False,
        "payload_bytes": 1,
        "ingested_at": NOW,
    }
    rows = pa.Table.from_pylist(
        [row, {**row, "sequence_number": 1, "headers": [{"key": "h", "value": b"\xff"}]}], LOG_SCHEMA
    )
    writer = DataFileWriter(FileTarget.of(table))
    writer.write(rows.slice(0, 1))
    writer.write(rows.slice(1))
    written = writer.close()
    commit_data_files(table, [written], {}, "main")
    assert catalog.load_table((ns, "old__log")).scan().to_arrow().num_rows == 2
    (path,) = compat.data_file_paths(written)
    back = pq.read_table(path.removeprefix("file://"))  # pyiceberg's scan reads a null list as []
    assert back["headers"].to_pylist() == [None, [{"key": "h", "value": b"\xff"}]]
    assert back["headers_json"].to_pylist() == [None, None]

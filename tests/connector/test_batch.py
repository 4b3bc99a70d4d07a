"""Batch decode (Arrow route + per-record route) against the per-record decoder, no Spark."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connector.batch import DECODE_CHUNK, RecordBatch, at_or_after, decode_batch, log_rows
from connector.core.records import DeadLetter, SourceRecord
from connector.debezium import Decoder
from connector.sources import file as file_source

NOW = datetime(2024, 1, 1, tzinfo=UTC)


def reference(records: list[SourceRecord], key_fields=None):
    """What `Decoder.decode`, one record at a time, gives: rows per table, dead letters, topic map."""
    d = Decoder(key_fields)
    events, letters = {}, {}
    for r in records:
        out = d.decode(r)
        (letters if isinstance(out, DeadLetter) else events).setdefault(out.table, []).append(out)
    rows = {t: normal(log_rows(e, NOW)) for t, e in events.items()}
    dead = {
        t: sorted((x.record.stream, x.record.sequence_number, x.reason, x.detail) for x in v)
        for t, v in letters.items()
    }
    return rows, dead, d.topic_tables()


def batched(records: list[SourceRecord], key_fields=None, split: int = 0, chunk: int = DECODE_CHUNK):
    """`decode_batch` over records[:split] then records[split:], one decoder; a topic's
    records in chunks of `chunk` (on threads when there are several)."""
    d = Decoder(key_fields)
    parts, letters = {}, {}
    for part in (records[:split], records[split:]):
        out = decode_batch(d, RecordBatch.of(part), NOW, chunk)
        for t, rows in out.events.items():
            parts.setdefault(t, []).extend(p.table for p in rows)
        for t, v in out.letters.items():
            letters.setdefault(t, []).extend(v)
    rows = {t: normal(pa.concat_tables(p)) for t, p in parts.items()}
    dead = {
        t: sorted((x.record.stream, x.record.sequence_number, x.reason, x.detail) for x in v)
        for t, v in letters.items()
    }
    return rows, dead, d.topic_tables()


def normal(table: pa.Table) -> list[dict]:
    """Rows in log order; after-images compared as typed values (null columns read as absent)."""
    rows = table.to_pylist()
    for r in rows:
        if r["after"] is not None:
            r["after"] = {k: (type(v).__name__, v) for k, v in orjson.loads(r["after"]).items() if v is not None}
        if r["after_types"] is not None:
            r["after_types"] = orjson.loads(r["after_types"])
    return sorted(rows, key=lambda r: (r["topic"], r["partition"], r["sequence_number"]))


def record(i: int, topic: str, key: bytes | None, value: bytes | None, partition: int = 0) -> SourceRecord:
    return SourceRecord(topic, partition, str(i), i, NOW, key, value)


scalars = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(2**63, 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([5.0, -0.0, 0.5, 1e-7, 1e20]),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
    st.sampled_from(['say "hi"', "back\\slash", "tab\there", "é ✓ 𝄞", "2024-01-01T00:00:00Z"]),
)
afters = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(["id", "name", "v", "w x", 'q"']),
        st.one_of(
            scalars, st.lists(st.integers(), max_size=2), st.dictionaries(st.just("n"), st.integers(), max_size=1)
        ),
        max_size=4,
    ),
    st.fixed_dictionaries(
        {"id": st.integers(0, 9)},
        optional={  # columns that keep one kind
            "amount": st.one_of(st.integers(-5, 5), st.floats(-5, 5)),
            "label": st.text(max_size=4),
            "flag": st.booleans(),
        },
    ),
)
sources = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {
            "connector": st.sampled_from(["postgresql", "PostgreSQL", "mysql"]),
            "table": st.sampled_from(["items", "orders", "Odd Name", "", "2024-01-01"]),
            "lsn": st.one_of(st.integers(0, 2**40), st.none()),
            "snapshot": st.sampled_from(["true", "false", "last", "incremental", True, False, None]),
            "ts_ms": st.sampled_from([0, 1700000000000, None]),
        },
        optional={"file": st.just("mysql-bin.000003"), "pos": st.integers(0, 999)},
    ),
)


@st.composite
def values(draw) -> bytes | None:
    kind = draw(st.sampled_from(["envelope"] * 8 + ["tombstone", "schema", "not-json", "pretty", "unwrapped"]))
    if kind == "tombstone":
        return None
    if kind == "not-json":
        return b"{not json"
    doc = {
        "op": draw(st.sampled_from(["c", "u", "d", "r", "c", "u", "t", "x"])),
        "before": None,
        "after": draw(afters),
        "source": draw(sources),
        "ts_ms": draw(st.sampled_from([1700000000001, None])),
    }
    if kind == "schema":
        doc = {"schema": {"type": "struct", "fields": []}, "payload": doc}
    if kind == "unwrapped":
        doc = {"id": 1, "__op": "u", "__source_table": "items", "__lsn": 7}
    return json.dumps(doc, indent=1 if kind == "pretty" else None).encode()


keys = st.one_of(
    st.none(),
    st.just(b"null"),
    st.just(b"plain-key"),
    st.integers(0, 5).map(lambda i: b'{"id":%d}' % i),
    st.dictionaries(
        st.sampled_from(["z", "id", "a b"]),
        st.one_of(
            st.integers(-3, 3),
            st.text(max_size=3),
            st.booleans(),
            st.none(),
            st.floats(0, 2),
            st.lists(st.integers(), max_size=1),
        ),
        min_size=1,
        max_size=3,
    ).map(lambda d: json.dumps(d).encode()),
    st.just(b'{"schema":{"type":"int32"},"payload":7}'),
    st.just(b'{"id": 1 }'),
)


@st.composite
def batches(draw) -> list[SourceRecord]:
    n = draw(st.integers(1, 25))
    topics = st.sampled_from(["srv.public.items", "srv.public.orders", "srv.other.things"])
    return [record(i, draw(topics), draw(keys), draw(values()), partition=draw(st.integers(0, 1))) for i in range(n)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches(), st.sampled_from([None, {"orders": ["id"]}]), st.integers(0, 25), st.sampled_from([DECODE_CHUNK, 1, 3])
)
def test_batch_decode_gives_what_the_record_decoder_gives(records, key_fields, split, chunk):
    """Over two batches: the second one routes bare tombstones by what the first taught.
    Small chunks decode a topic's records in several parts on threads, to the same rows."""
    assert batched(records, key_fields, split, chunk) == reference(records, key_fields)


def test_real_samples_decode_alike(fixtures):
    records = []
    for path in sorted(fixtures.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                records.append(
                    record(len(records), "srv.inventory." + path.stem.split("_")[1], b'{"id":1}', line.encode())
                )
    assert batched(records, {"customers": ["id"]}) == reference(records, {"customers": ["id"]})


class Counting(Decoder):
    calls = 0

    def decode(self, record):
        Counting.calls += 1
        return super().decode(record)


@pytest.mark.parametrize("line_break", ["\n", "\r\n"])
def test_plain_postgres_events_take_the_arrow_route(line_break):
    events = [
        {
            "op": op,
            "after": None if op == "d" else {"id": i, "price": 1.25, "name": f'n"{i}', "ok": True},
            "source": {"connector": "postgresql", "table": "items", "lsn": 100 + i, "snapshot": "false"},
        }
        for i, op in enumerate(["r", "c", "u", "d"])
    ]
    records = [record(i, "srv.public.items", b'{"id":%d}' % i, json.dumps(e).encode()) for i, e in enumerate(events)]
    records.append(record(4, "srv.public.items", b'{"id":3}', None))  # topic not known yet: record route
    records.append(record(5, "srv.public.items", b'{"id":2}', None))
    pretty = json.dumps({**events[1], "after": {"id": 9}}, indent=1).replace("\n", line_break)
    records.append(record(6, "srv.public.items", b'{"id":9}', pretty.encode()))  # multi-line: record route alone
    Counting.calls = 0
    decoder = Counting()
    first = decode_batch(decoder, RecordBatch.of(records[:5]), NOW)
    second = decode_batch(decoder, RecordBatch.of(records[5:]), NOW)  # the topic is known now
    assert Counting.calls == 2
    got = [p.table for out in (first, second) for p in out.events["items"]]
    assert normal(pa.concat_tables(got)) == reference(records)[0]["items"]


@pytest.mark.parametrize(
    "odd, switches",
    [
        ({"headers": ["h", "v"]}, True),
        ({"sequence_number": 30, "partition_key": "pk"}, True),
        ({"enqueued_time": "2024-05-01T10:00:00Z"}, True),
        ({"offset": "30"}, True),
        ({"key": {"id": 30}}, True),
        ({"topic": ""}, True),
        ({"topic": None}, False),  # a missing topic is source.topic's on both routes
    ],
)
def test_file_source_columns_match_the_line_reader_and_switch_mid_file(tmp_path, odd, switches):
    lines = [
        {
            "topic": "a.b.c",
            "partition": i % 2,
            "offset": i,
            "ts": 1700000000000 + i,
            "key": f"k{i}",
            "payload": None if i % 5 == 0 else f'{{"op":"c","n":{i}}}',
            "tstype": "create",
        }
        for i in range(40)
    ]
    lines[30].update(odd)  # this line's range goes through the line reader
    f = tmp_path / "dump.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines[:10]) + "\n\n" + "\n".join(json.dumps(x) for x in lines[10:]))
    ranges = file_source.plan_ranges(f, target_bytes=512)  # several ranges; the plain ones go through Arrow
    assert len(ranges) > 4 and ranges[0].first_line == 1
    plain = []
    for r in ranges:
        data = f.read_bytes()[r.start : r.end]
        by_line = file_source._lines(data, r, "a.b.c", 1 << 20)
        columns = file_source._plain(data, "a.b.c")
        plain.append(columns is not None)
        assert columns is None or columns.to_pylist() == by_line.to_pylist()
        assert file_source.read_range(r, "a.b.c").to_pylist() == by_line.to_pylist()
    assert (not all(plain)) == switches and sum(plain) >= len(ranges) - 1
    got = pa.concat_tables([file_source.read_range(r, "a.b.c") for r in ranges])
    got = got.filter(at_or_after(got, {"a.b.c:0": 6})).to_pylist()
    want = [json.loads(x) for x in f.read_text().splitlines() if x]
    seqs = [(x.get("partition", 0), int(x.get("sequence_number", x["offset"]))) for x in want]
    assert [(r["partition"], r["sequence_number"]) for r in got] == [(p, q) for p, q in seqs if p or q >= 6]


key_docs = st.dictionaries(
    st.sampled_from(["z", "id", "a b", 'q"']),
    st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=4), st.booleans(), st.none()),
    min_size=1,
    max_size=3,
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            key_docs.map(lambda d: json.dumps(d).encode()),
            key_docs.map(lambda d: json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode()),  # compact
            st.sampled_from(
                [
                    b"plain",
                    b"null",
                    b'{"schema":{},"payload":{"id":1}}',
                    b'{"id": 1 }',
                    b"{oops",
                    b'{"id":-0}',
                    b'{"id":007}',
                    b'{"id":1.0}',
                    b'{"id":true}',
                    b'{"id":123456789012345678901}',
                    b'{"id":"a\\"b"}',
                    b'{"id":"\\u0041"}',
                    b'{"id":"\xc3\xa9"}',
                    b'{"id":"a/b~"}',
                    b'{"id":"\x7f"}',
                ]
            ),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_key_texts_are_the_canonical_key_texts(raw_keys):
    """Arrow's keys equal the per-record route's, and are null exactly where that route
    refuses the key (not JSON, not an object) or has none (JSON null)."""
    from connector.arrow_json import key_texts
    from connector.keys import key_text_or_none

    assert key_texts(pa.array(raw_keys, pa.binary())).to_pylist() == list(map(key_text_or_none("json"), raw_keys))


@pytest.mark.parametrize(
    "raw,json_key,text_key",
    [
        (b'{"id":5}', '{"id":5}', '{"id":5}'),
        (
            b'{"schema":{"type":"struct"},"payload":{"id":5}}',
            '{"id":5}',
            '{"schema":{"type":"struct"},"payload":{"id":5}}',
        ),
        (b"id=5", None, "id=5"),  # not JSON: refused as a Debezium key, a text key as sent
        (b"5", None, "5"),  # JSON, not an object
        (b'"5"', None, '"5"'),
        (b"[5]", None, "[5]"),
        (b"null", None, "null"),  # a JSON null is no key
        (b"\xff\xfe", None, None),  # not UTF-8 either: refused, never replaced by U+FFFD
    ],
)
def test_key_formats(raw, json_key, text_key):
    from connector.arrow_json import key_texts
    from connector.keys import key_text_or_none

    for fmt, want in (("json", json_key), ("text", text_key)):
        assert key_text_or_none(fmt)(raw) == want
        assert key_texts(pa.array([raw], pa.binary()), fmt).to_pylist() == [want]

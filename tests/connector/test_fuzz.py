"""Hostile input: seeded random mutations of the real Debezium samples through both decode
routes (no Spark). Every record must end as exactly one log row or one dead letter with
its bytes unchanged, and the Arrow route must give what the per-record route gives, record
by record, alone or in any batch. `CDCLAKE_FUZZ_RECORDS` sets how many (default 3,000)."""

from __future__ import annotations

import json
import os
import random

import pyarrow as pa
import pytest

from connector.batch import RecordBatch, decode_batch
from connector.core.records import DeadLetter
from connector.debezium import Decoder
from tests.connector.test_batch import NOW, batched, normal, record, reference

RECORDS = int(os.environ.get("CDCLAKE_FUZZ_RECORDS", "3000"))

# Values no decoder should take silently: too deep, not JSON numbers, outside 64 bits,
# wrong kinds, names a table cannot hold.
HOSTILE = [
    "[" * 10_000 + "]" * 10_000,
    "[" * 70 + "]" * 70,
    "NaN",
    "Infinity",
    "-Infinity",
    str(2**64 + 5),
    str(2**63),
    str(-(2**63) - 1),
    "1e400",
    "1.5",
    "true",
    "null",
    '"text"',
    "[1,2,3]",
    "{}",
    '{"": 1}',
    '{"_key": 1}',
    '{"Name": 1, "name": 2}',
    '"\\ud800"',
    '"\\u0000"',
    "0.30000000000000004",
    "-0",
    "123456789012345678901234567890",
]
SLOTS = [
    ("source", "lsn"),
    ("source", "pos"),
    ("source", "row"),
    ("source", "ts_ms"),
    ("source", "table"),
    ("source", "commit_lsn"),
    ("source", "snapshot"),
    ("source", "sequence"),
    ("op",),
    ("ts_ms",),
    ("after",),
    ("after", "id"),
    ("after", "v"),
    ("payload",),
    ("source",),
    ("before",),
]


def samples(fixtures) -> list[tuple[str, bytes]]:
    out = []
    for path in sorted(fixtures.glob("*.jsonl")):
        table = path.stem.split("_")[1]
        out += [(table, line.encode()) for line in path.read_text().splitlines() if line.strip()]
    return out


def mutate(rng: random.Random, raw: bytes) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:  # flip bytes
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if kind == 1:  # cut short
        return raw[: rng.randrange(len(raw))]
    if kind == 2:  # a hostile value in place of one field (text splice: the JSON stays valid or nearly)
        doc = json.loads(raw)
        target = doc.get("payload", doc) if isinstance(doc, dict) else doc
        slot = rng.choice(SLOTS)
        marker = "\u2603MARK\u2603"
        node = target
        for k in slot[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return raw
        node[slot[-1]] = marker
        return json.dumps(doc).replace(json.dumps(marker), rng.choice(HOSTILE)).encode()
    if kind == 3:  # another whole value
        return rng.choice(HOSTILE).encode()
    if kind == 4:  # invalid UTF-8 inside a string
        i = raw.find(b'":"')
        return raw if i < 0 else raw[: i + 3] + b"\xff\xfe" + raw[i + 3 :]
    return raw


@pytest.fixture(scope="module")
def fuzzed(fixtures):
    rng = random.Random(20261124)
    base = samples(fixtures)
    records = []
    postgres = [s for s in base if b'"postgresql"' in s[1]]  # the shape the Arrow route reads: half the stream
    for i in range(RECORDS):
        table, raw = rng.choice(postgres if rng.random() < 0.5 else base)
        key = (
            b'{"id":%d}' % rng.randrange(50)
            if rng.random() < 0.8
            else rng.choice([b"id=7", b"[1]", b"\xff", None, b'{"id":' + b"[" * 200, b'{"id":' + b"9" * 25 + b"}"])
        )
        value = None if rng.random() < 0.03 else mutate(rng, raw) if rng.random() < 0.5 else raw
        records.append(record(i, f"srv.inventory.{table}", key, value, partition=rng.randrange(2)))
    return records


def outcome(records):
    """Per record (stream, sequence number): ('row', table) or ('dead', table, reason)."""
    rows, dead, _ = reference(records, {"customers": ["id"]})
    out = {}
    for table, rs in rows.items():
        for r in rs:
            out[(f"{r['topic']}:{r['partition']}", r["sequence_number"])] = ("row", table)
    for table, ds in dead.items():
        for stream, seq, reason, _ in ds:
            out[(stream, seq)] = ("dead", table, reason)
    return out


def test_the_arrow_route_takes_part_of_the_stream(fuzzed):
    """Else the comparison below would compare the per-record route with itself."""
    from connector.arrow_json import json_objects

    class Counting(Decoder):
        calls = 0

        def decode(self, record):
            Counting.calls += 1
            return super().decode(record)

    d = Counting({"customers": ["id"]})
    for i in range(0, len(fuzzed), 4):  # Arrow reads a chunk whole or not at all: small batches
        decode_batch(d, RecordBatch.of(fuzzed[i : i + 4]), NOW)
    assert Counting.calls < len(fuzzed) * 0.8, Counting.calls
    assert json_objects(pa.array([r.value for r in fuzzed], pa.binary())).true_count > len(fuzzed) // 4


def test_every_record_is_one_row_or_one_dead_letter(fuzzed):
    got = outcome(fuzzed)
    assert len(got) == len(fuzzed), "a record vanished or was counted twice"
    # the mix is hostile: both outcomes and many reasons occur
    reasons = {o[2] for o in got.values() if o[0] == "dead"}
    assert sum(o[0] == "row" for o in got.values()) > len(fuzzed) // 10
    assert {"json", "key", "envelope", "value", "limit", "position"} <= reasons, reasons


@pytest.mark.parametrize("chunk", [20_000, 7])
def test_the_arrow_route_gives_what_the_record_route_gives(fuzzed, chunk):
    keys = {"customers": ["id"]}
    assert batched(fuzzed, keys, split=len(fuzzed) // 3, chunk=chunk) == reference(fuzzed, keys)


def test_in_small_batches_too(fuzzed):
    """Small batches, where the Arrow route reads most records (it reads a chunk whole or not
    at all), give the per-record route's rows and dead letters, record by record."""
    keys = {"customers": ["id"]}
    d = Decoder(keys)
    rows, letters = [], []
    for i in range(0, len(fuzzed), 4):
        out = decode_batch(d, RecordBatch.of(fuzzed[i : i + 4]), NOW)
        rows += [r for rs in out.events.values() for p in rs for r in normal(p.table)]
        letters += [
            (x.record.stream, x.record.sequence_number, x.reason, x.detail) for v in out.letters.values() for x in v
        ]
    want_rows, want_dead, _ = reference(fuzzed, keys)
    assert sorted(rows, key=repr) == sorted([r for rs in want_rows.values() for r in rs], key=repr)
    assert sorted(letters) == sorted(x for v in want_dead.values() for x in v)


def test_dead_letters_keep_the_input_bytes(fuzzed):
    out = decode_batch(Decoder({"customers": ["id"]}), RecordBatch.of(fuzzed), NOW)
    by_pos = {(r.stream, r.sequence_number): r for r in fuzzed}
    letters = [d for ds in out.letters.values() for d in ds]
    assert letters
    for d in letters:
        assert isinstance(d, DeadLetter)
        original = by_pos[(d.record.stream, d.record.sequence_number)]
        assert (d.record.key, d.record.value) == (original.key, original.value)
    rows = sum(r.table.num_rows for rs in out.events.values() for r in rs)
    assert rows + len(letters) == len(fuzzed)
    # the log rows keep the raw value bytes too
    for rs in out.events.values():
        for r in rs:
            for topic, part, seq, value in zip(
                *(r.table[c].to_pylist() for c in ("topic", "partition", "sequence_number", "value"))
            ):
                assert value == by_pos[(f"{topic}:{part}", seq)].value


def test_each_record_alone_decodes_as_in_the_batch(fuzzed):
    """The outcome of a record does not depend on the batch it came in."""
    together = outcome(fuzzed)
    for r in fuzzed[:300]:
        assert outcome([r])[(r.stream, r.sequence_number)] == together[(r.stream, r.sequence_number)]
        alone = decode_batch(Decoder({"customers": ["id"]}), RecordBatch.of([r]), NOW)
        kind = "dead" if alone.letters else "row"
        assert kind == together[(r.stream, r.sequence_number)][0]


def test_arrow_never_reads_a_deep_value(fuzzed):
    """pyarrow's JSON reader recursed into a 10,000-deep array and crashed the process."""
    from connector.arrow_json import json_objects

    deep = pa.array([b'{"a":' + b"[" * 10_000 + b"]" * 10_000 + b"}", b'{"a":1}'], pa.binary())
    assert json_objects(deep).to_pylist() == [False, True]

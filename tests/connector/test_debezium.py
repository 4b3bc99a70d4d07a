"""Decoding of real Debezium samples (tests/fixtures/debezium), no Spark."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from connector.core.records import ChangeEvent, DeadLetter, SourceRecord
from connector.debezium import Decoder
from connector.keys import canonical

T = datetime(2024, 1, 1, tzinfo=UTC)


def _enc(v) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    return (v if isinstance(v, str) else json.dumps(v)).encode()


def rec(value, key=None, topic="srv.inventory.customers", offset=0, partition=0) -> SourceRecord:
    return SourceRecord(topic, partition, str(offset), offset, T, _enc(key), _enc(value))


def decode_lines(path, key_fields=None, topic="srv.inventory.customers"):
    d = Decoder(key_fields)
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [d.decode(rec(line, topic=topic, offset=i)) for i, line in enumerate(lines)]


@pytest.mark.parametrize("name", ["mysql_customers_cdc_plain.jsonl", "mysql_customers_cdc_with_schema.jsonl"])
def test_mysql_customers_both_converters_decode_alike(fixtures, name):
    events = decode_lines(fixtures / name, {"customers": ["id"]})
    assert all(isinstance(e, ChangeEvent) for e in events)
    assert [e.op for e in events] == ["r"] * 4 + ["c", "u", "c", "u", "u", "d"]
    assert [e.snapshot for e in events] == [True] * 4 + [False] * 6
    assert events[0].position == (3, 157, 0)
    # two rows of one binlog event are told apart by `row`
    assert events[7].position[:2] == events[8].position[:2] and events[7].position < events[8].position
    assert events[9].key == events[8].key == '{"id":1006}' and events[9].after is None
    assert events[0].table == "customers" and events[0].after["first_name"] == "Sally"


def test_schema_types_are_taken_from_the_connect_schema(fixtures):
    with_schema = decode_lines(fixtures / "mysql_customers_cdc_with_schema.jsonl", {"customers": ["id"]})
    plain = decode_lines(fixtures / "mysql_customers_cdc_plain.jsonl", {"customers": ["id"]})
    assert with_schema[0].after_types["id"] == "int"  # int32 in the schema
    assert plain[0].after_types["id"] == "bigint"  # inferred from JSON
    assert with_schema[0].after == plain[0].after


def test_debezium_date_and_key_with_schema(fixtures):
    value = (fixtures / "mysql_snapshot_read_value_with_schema.json").read_text()
    key = (fixtures / "mysql_snapshot_read_key_with_schema.json").read_text()
    e = Decoder().decode(rec(value, key, topic="testc.inventory.orders"))
    assert isinstance(e, ChangeEvent), e
    assert e.key == '{"order_number":10004}'
    assert e.after_types["order_date"] == "date"
    assert e.after["order_date"].startswith("20")  # ISO date text, castable by Spark
    assert e.snapshot and e.op == "r" and e.table == "orders"


def test_delete_with_schema_and_envelope_v2(fixtures):
    value = (fixtures / "mysql_delete_value_with_schema.json").read_text()
    key = (fixtures / "mysql_delete_key_with_schema.json").read_text()
    e = Decoder().decode(rec(value, key))
    assert isinstance(e, ChangeEvent) and e.op == "d" and e.key == '{"id":1004}' and e.position == (3, 632, 0)


def test_postgres_position_and_junk_key(fixtures):
    lines = (fixtures / "postgres_orders_snapshot_then_update_junk_key.txt").read_text().splitlines()
    d = Decoder({"orders": ["order_id"]})
    events = [
        d.decode(rec(v, k, topic="postgres.public.orders", offset=i))
        for i, (k, v) in enumerate(line.split("^", 1) for line in lines)
    ]
    assert [e.key for e in events] == ['{"order_id":1}', '{"order_id":2}', '{"order_id":3}', '{"order_id":1}']
    assert events[0].position == (23911624,) and events[0].snapshot
    assert events[3].position > events[0].position and not events[3].snapshot
    # without key_fields the junk record key is a dead letter (Debezium keys are JSON objects) ...
    refused = Decoder().decode(rec(lines[0].split("^", 1)[1], "****"))
    assert isinstance(refused, DeadLetter) and refused.reason == "key", refused
    # ... unless the source's keys are text (Event Hubs AMQP's partition key): then used as sent
    assert Decoder(key_format="text").decode(rec(lines[0].split("^", 1)[1], "****")).key == "****"


def test_postgres_replica_identity_default_delete_keeps_record_key(fixtures):
    lines = (fixtures / "postgres_products_replica_identity_default_plain.jsonl").read_text().splitlines()
    delete = [line for line in lines if '"op":"d"' in line][0]
    e = Decoder({"products": ["id"]}).decode(rec(delete, {"id": 111}))
    assert isinstance(e, ChangeEvent) and e.op == "d" and e.key == '{"id":111}'


def test_postgres_without_sequence_uses_lsn(fixtures):
    events = decode_lines(fixtures / "postgres_products_cdc_plain.jsonl", {"products": ["id"]})
    assert all(isinstance(e, ChangeEvent) and e.position and len(e.position) == 1 for e in events)
    assert events[-1].position > events[0].position


def test_legacy_snapshot_as_create_is_a_snapshot(fixtures):
    events = decode_lines(fixtures / "mysql_products_legacy_snapshot_as_create_plain.jsonl", {"products": ["id"]})
    assert [e.op for e in events[:9]] == ["c"] * 9 and all(e.snapshot for e in events[:9])
    assert not any(e.snapshot for e in events[9:])


def test_sqlserver_degenerate_lsn_falls_back_to_log_order(fixtures):
    e = Decoder({"full_types_1": ["id"]}).decode(
        rec((fixtures / "sqlserver_snapshot_read_degenerate_lsn_plain.json").read_text())
    )
    assert isinstance(e, ChangeEvent) and e.position is None and e.key == '{"id":1}'


@pytest.mark.parametrize("name", ["sqlserver_customers_snapshot_then_create_avro_json.jsonl"])
def test_avro_json_is_rejected_with_a_reason(fixtures, name):
    out = decode_lines(fixtures / name, {"customers": ["id"]})
    assert all(isinstance(o, DeadLetter) and o.reason == "avro-json" for o in out)
    assert "JsonConverter" in out[0].detail


def test_kcat_avro_decoded_payload_is_rejected(fixtures):
    from connector.sources.file import parse_line

    r = parse_line(json.loads((fixtures / "kcat_J_mysql_avro_snapshot_last.json").read_text()))
    assert (r.topic, r.partition, r.offset) == ("asgard.demo.customers", 0, "5")
    out = Decoder().decode(r)
    assert isinstance(out, DeadLetter) and out.reason == "avro-json" and out.table == "customers"


def test_sqlserver_position_orders_commit_then_change_then_serial():
    src = {
        "connector": "sqlserver",
        "table": "t",
        "commit_lsn": "00000025:00000518:0005",
        "change_lsn": "00000025:00000518:0003",
        "event_serial_no": 2,
    }
    e = Decoder().decode(rec({"op": "u", "after": {"id": 1}, "source": src}, {"id": 1}))
    assert e.position == (0x25, 0x518, 5, 0x25, 0x518, 3, 2)


def test_tombstone_and_missing_key():
    d = Decoder()
    t = d.decode(rec(None, {"id": 7}))
    assert isinstance(t, ChangeEvent) and t.op == "d" and t.tombstone and t.key == '{"id":7}' and t.position is None
    assert t.table == "customers"  # from the topic's last segment
    n = d.decode(rec(None, None))
    assert isinstance(n, DeadLetter) and n.reason == "no-key"
    m = d.decode(rec({"op": "c", "after": {"id": 1}, "source": {"table": "customers"}}, None))
    assert isinstance(m, DeadLetter) and m.reason == "no-key" and "key_fields" in m.detail


@pytest.mark.parametrize(
    "value,reason",
    [
        ("{not json", "json"),
        ("[1,2]", "envelope"),
        ('{"id": 1}', "envelope"),
        ('{"op": "x", "after": {"id": 1}}', "op"),
        ('{"op": "c", "after": null}', "envelope"),
    ],
)
def test_bad_input_becomes_a_dead_letter(value, reason):
    out = Decoder().decode(rec(value, {"id": 1}, offset=42))
    assert isinstance(out, DeadLetter) and out.reason == reason and out.record.offset == "42"


def test_extract_new_record_state_output():
    d = Decoder({"customers": ["id"]})
    up = d.decode(
        rec({"id": 1, "name": "a", "__op": "u", "__lsn": 99, "__source_connector": "postgresql", "__deleted": "false"})
    )
    assert up.op == "u" and up.after == {"id": 1, "name": "a"} and up.position == (99,)
    gone = d.decode(rec({"id": 1, "name": "a", "__deleted": "true", "__op": "d"}))
    assert gone.op == "d" and gone.key == '{"id":1}' and gone.after is None


def test_primary_key_change_is_delete_tombstone_create(fixtures):
    """The sequence of mysql_pk_change_delete_tombstone_create_connect_records.txt, as JSON."""
    text = (fixtures / "mysql_pk_change_delete_tombstone_create_connect_records.txt").read_text()
    assert "kafkaOffset=62978" in text and "kafkaOffset=62980" in text
    src = {"connector": "mysql", "table": "sbtest1", "file": "mysql-bin.000003", "pos": 16209369, "row": 0}
    old, new = {"id": 2317, "k": 3737}, {"id": 2317, "k": 3738}
    d = Decoder()
    out = [
        d.decode(rec(v, k, topic="SERVER5432.sbtest.sbtest1", offset=o))
        for o, k, v in [
            (62978, old, {"op": "d", "before": old, "after": None, "source": src}),
            (62979, old, None),
            (62980, new, {"op": "c", "before": None, "after": new, "source": src}),
        ]
    ]
    assert [(e.op, e.key, e.tombstone) for e in out] == [
        ("d", canonical(old), False),
        ("d", canonical(old), True),
        ("c", canonical(new), False),
    ]
    assert {e.table for e in out} == {"sbtest1"}


def test_truncate_has_no_key():
    e = Decoder().decode(rec({"op": "t", "source": {"connector": "postgresql", "table": "customers", "lsn": 5}}))
    assert isinstance(e, ChangeEvent) and e.op == "t" and e.key is None and e.position == (5,)


def test_schemaless_types_follow_each_images_values_not_a_cached_guess():
    """Types are cached per (columns, Python types): images that differ in either get their own."""
    d = Decoder({"t": ["id"]})
    src = {"connector": "postgresql", "table": "t", "lsn": 1}
    a, b, c, n = (
        d.decode(rec({"op": "c", "after": after, "source": src}))
        for after in ({"id": 1, "v": 2}, {"id": 2, "v": 3}, {"id": 3, "v": True}, {"id": 4, "v": {"x": [1]}})
    )
    assert (
        a.after_types == {"id": "bigint", "v": "bigint"} and a.after_types is b.after_types
    )  # shared, serialised once
    assert c.after_types == {"id": "bigint", "v": "boolean"} and c.after == {"id": 3, "v": True}
    assert n.after_types == {"id": "bigint", "v": "string"} and n.after == {"id": 4, "v": '{"x":[1]}'}
    assert d.decode(rec({"op": "c", "after": {"v": None, "id": 5}, "source": src})).after_types == {"id": "bigint"}


# Kafka Connect's JsonConverter names of the primitive schema types (JsonSchema's *_TYPE_NAME
# constants), and the Spark type each column gets.
CONNECT_TYPES = [
    ("int8", 1, "int"),
    ("int16", 2, "int"),
    ("int32", 3, "int"),
    ("int64", 4, "bigint"),
    ("float", 1.5, "float"),
    ("double", 14133.97, "double"),
    ("boolean", True, "boolean"),
    ("string", "x", "string"),
    ("bytes", "AAE=", "binary"),
]


@pytest.mark.parametrize("connect_type,value,spark_type", CONNECT_TYPES)
def test_every_jsonconverter_type_name_keeps_its_type(connect_type, value, spark_type):
    """A schema-enabled stream types a column as the schema says, never as text
    (`{"schema", "payload"}` as JsonConverter writes it with schemas.enable=true)."""
    field = {"type": connect_type, "optional": True, "field": "v"}
    envelope = {
        "schema": {
            "type": "struct",
            "fields": [
                {
                    "type": "struct",
                    "fields": [{"type": "int32", "optional": False, "field": "id"}, field],
                    "optional": True,
                    "name": "srv.inventory.customers.Value",
                    "field": "after",
                },
                {"type": "string", "optional": False, "field": "op"},
            ],
            "optional": False,
        },
        "payload": {
            "op": "c",
            "after": {"id": 1, "v": value},
            "source": {"connector": "postgresql", "table": "customers", "lsn": 7},
        },
    }
    e = Decoder().decode(rec(envelope, {"id": 1}))
    assert isinstance(e, ChangeEvent), e
    assert e.after_types["v"] == spark_type
    assert e.after["v"] == value  # the value as sent: Spark casts it to the column's type
    if connect_type == "double":  # the same event without schemas is typed alike
        plain = Decoder().decode(rec(envelope["payload"], {"id": 1}))
        assert plain.after_types["v"] == e.after_types["v"] == "double"


def _pg(after=None, **source):
    return {
        "op": "c",
        "after": after if after is not None else {"id": 1, "v": 2},
        "source": {"connector": "postgresql", "table": "things", "lsn": 5, **source},
    }


def _typed(connect: dict, value) -> dict:
    """A schema-enabled event with one typed column `d`."""
    return {
        "schema": {
            "type": "struct",
            "fields": [
                {
                    "field": "after",
                    "type": "struct",
                    "fields": [{"field": "id", "type": "int32"}, {"field": "d", **connect}],
                }
            ],
        },
        "payload": {
            "op": "c",
            "after": {"id": 1, "d": value},
            "source": {"connector": "postgresql", "table": "things", "lsn": 5},
        },
    }


DECIMAL = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal"}

# (value bytes or JSON-able, reason): each class of hostile input ends as a dead letter
HOSTILE = [
    (b'{"op":"c","after":{"id":1,"v":' + b"[" * 10_000 + b"]" * 10_000 + b"}}", "json"),  # past orjson's own limit
    (b'{"op":"c","after":{"id":1,"v":' + b"[" * 70 + b"]" * 70 + b'},"source":{"lsn":5}}', "limit"),  # max_depth
    (b'{"op":"c","after":{"id":1,"v":NaN}}', "json"),
    (_pg(lsn=2**70), "position"),
    (_pg(lsn=1.5), "position"),
    (_pg(lsn=True), "position"),
    (
        {
            "op": "c",
            "after": {"id": 1},
            "source": {"connector": "mysql", "table": "t", "file": "b.000001", "pos": 2**70},
        },
        "position",
    ),
    (
        {
            "op": "c",
            "after": {"id": 1},
            "source": {"connector": "sqlserver", "table": "t", "commit_lsn": "12345678901234567890"},
        },
        "position",
    ),
    (_pg(ts_ms="yesterday"), "envelope"),
    (_pg({"id": 1, "v": 2**64 + 5}), "value"),
    (_pg({"id": 1, "v": 2**63}), "value"),
    (b"[1,2,3]", "envelope"),
    (b"42", "envelope"),
    (b"null", "envelope"),
    (b'{"op":"c","after":{"id":1,"v":"\xff\xfe"},"source":{"lsn":5}}', "json"),
    (_typed({"type": "int32", "name": "io.debezium.time.Date"}, 10**10), "value"),
    (_typed({"type": "int64", "name": "io.debezium.time.MicroTimestamp"}, 2**62), "value"),
    (_typed({**DECIMAL, "parameters": {"scale": "-1000000000"}}, "AQ=="), "value"),
    (_typed({**DECIMAL, "parameters": {"scale": "2", "connect.decimal.precision": "3"}}, "AYaf"), "value"),  # 99999
    (_pg({"id": 1, "": 2}), "schema"),
    (_pg({"id": 1, "_key": 2}), "schema"),
    (_pg({"id": 1, "Name": "a", "name": "b"}), "schema"),
    (_pg({"id": 1, "x" * 200: 1}), "limit"),
    (_pg({"id": 1, **{f"c{i}": i for i in range(1001)}}), "limit"),
    (_pg(table="t" * 300), "route"),
    (b'{"op":"c","after":{"id":1,"v":"' + b"x" * (16 << 20) + b'"}}', "limit"),  # limits.max_value_bytes
]


@pytest.mark.parametrize("value,reason", HOSTILE, ids=[f"{i}-{r}" for i, (_, r) in enumerate(HOSTILE)])
def test_hostile_values_are_dead_letters_on_both_routes(value, reason):
    from connector.batch import RecordBatch, decode_batch

    r = rec(value, {"id": 1}, topic="db.s.things")
    out = Decoder().decode(r)
    assert isinstance(out, DeadLetter) and out.reason == reason, out
    batch = decode_batch(Decoder(), RecordBatch.of([r] * 3), T, chunk=1)
    assert not batch.events and [d.reason for ds in batch.letters.values() for d in ds] == [reason] * 3


@pytest.mark.parametrize(
    "connect,value,spark_type,text",
    [
        ({**DECIMAL, "parameters": {"scale": "2", "connect.decimal.precision": "5"}}, "AYaf", "decimal(5,2)", "999.99"),
        # beyond Spark's 38 digits: kept exactly, as text, never a column that blocks the table
        ({**DECIMAL, "parameters": {"scale": "100"}}, "AQ==", "string", "1E-100"),
        ({**DECIMAL, "parameters": {"scale": "2", "connect.decimal.precision": "50"}}, "AYaf", "string", "999.99"),
    ],
)
def test_decimals(connect, value, spark_type, text):
    e = Decoder().decode(rec(_typed(connect, value), {"id": 1}, topic="db.s.things"))
    assert isinstance(e, ChangeEvent), e
    assert (e.after_types["d"], e.after["d"]) == (spark_type, text)

"""A table's settings by exact name, glob or `[table_defaults]`, and the Kafka source's
`topics_pattern`: the resolution rule and the configuration errors (no Spark, no broker)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from connector.batch import RecordBatch, decode_batch
from connector.core.config import load_settings
from connector.core.errors import ConfigError
from connector.core.records import SourceRecord
from connector.debezium import decoder_for
from connector.sources.kafka import matching_topics
from quotas.errors import QuotaConfigError
from quotas.eventhubs_template import template
from quotas.ledger import table_quota, validate

# What a table gets when nothing is configured, written out (not read from the model).
BUILT_IN = {
    "key_fields": [],
    "tier": None,
    "compaction": True,
    "partitions": None,
    "log_retention_hours": None,
    "max_event_bytes": None,
    "compacted_bytes_per_partition": None,
}

TOML = """
[table_defaults]
tier = "premium"
log_retention_hours = 48

[tables."inventory_*"]
key_fields = ["id"]
compaction = false

[tables."inventory_o*"]
key_fields = ["order_id"]
partitions = 8

[tables.inventory_orders]
partitions = 2

[tables."*_audit"]
tier = "standard"
max_event_bytes = 1000
"""


@pytest.mark.parametrize(
    "table,expected",
    [
        # the exact entry beats both globs that match; the rest from [table_defaults], not the globs
        ("inventory_orders", {"partitions": 2, "tier": "premium", "log_retention_hours": 48}),
        # the first glob in file order: inventory_o* matches too, but comes second
        ("inventory_other", {"key_fields": ["id"], "compaction": False, "tier": "premium", "log_retention_hours": 48}),
        ("inventory_items", {"key_fields": ["id"], "compaction": False, "tier": "premium", "log_retention_hours": 48}),
        # an entry's own key wins over [table_defaults]'s, the keys it leaves unset come from there
        ("sales_audit", {"tier": "standard", "max_event_bytes": 1000, "log_retention_hours": 48}),
        # no entry: [table_defaults]
        ("customers", {"tier": "premium", "log_retention_hours": 48}),
        ("inventory", {"tier": "premium", "log_retention_hours": 48}),  # no "_": inventory_* does not match
    ],
)
def test_exact_beats_glob_first_glob_wins_and_defaults_fill_unset_keys(tmp_path, table, expected):
    cfg = tmp_path / "c.toml"
    cfg.write_text(TOML)
    assert load_settings(cfg).table(table).model_dump() == BUILT_IN | expected


@pytest.mark.parametrize(
    "tables,table,expected",
    [
        ({}, "orders", {}),
        ({"ord*": {"tier": "premium"}}, "orders", {"tier": "premium"}),
        ({"ord*": {"tier": "premium"}}, "customers", {}),
        ({"?rders": {"partitions": 3}, "orders": {"key_fields": ["k"]}}, "orders", {"key_fields": ["k"]}),
        ({"[a-n]*": {"partitions": 3}}, "orders", {}),
        ({"[a-n]*": {"partitions": 3}}, "items", {"partitions": 3}),
    ],
)
def test_without_table_defaults_the_built_in_defaults_fill_in(tables, table, expected):
    assert load_settings(tables=tables).table(table).model_dump() == BUILT_IN | expected


def test_a_glob_or_the_defaults_decide_the_tier_and_the_error_names_where_it_was_set():
    s = load_settings(tables={"inv_*": {"tier": "premium", "max_event_bytes": 2000}})
    q = table_quota(s, "inv_orders")
    assert (q.name, q.max_event_bytes, q.max_partitions) == ("premium", 2000, 100)
    assert table_quota(s, "orders").name == "standard"
    with pytest.raises(QuotaConfigError, match=r"^tables\.inv_\*\.tier = 'gold': unknown tier"):
        table_quota(load_settings(tables={"inv_*": {"tier": "gold"}}), "inv_orders")
    with pytest.raises(QuotaConfigError, match=r"^table_defaults\.tier = 'gold': unknown tier"):
        table_quota(load_settings(table_defaults={"tier": "gold"}, tables={"inv_*": {"partitions": 2}}), "inv_x")
    # the basic tier cannot compact: the glob's table is refused when it is first seen
    basic = load_settings(tables={"inv_*": {"tier": "basic"}, "orders": {"tier": "basic", "compaction": False}})
    with pytest.raises(QuotaConfigError, match=r"table 'inv_orders': compaction is not supported on the basic"):
        validate(basic, "inv_orders")
    assert validate(basic, "orders").name == "basic"
    assert basic.named_tables() == ["orders"]


def test_key_fields_of_a_glob_decide_the_key_in_the_batch_decode():
    s = load_settings(tables={"inv_*": {"key_fields": ["code"]}})
    now = datetime(2024, 1, 1, tzinfo=UTC)

    def rec(i: int, table: str) -> SourceRecord:
        value = {
            "op": "c",
            "after": {"id": i, "code": f"c{i}"},
            "source": {"connector": "postgresql", "table": table, "lsn": 10 + i, "ts_ms": 1},
        }
        return SourceRecord(
            f"pg.public.{table}", 0, str(i), i, now, json.dumps({"id": i}).encode(), json.dumps(value).encode()
        )

    records = [rec(0, "inv_things"), rec(1, "orders"), rec(2, "inv_things")]
    out = decode_batch(decoder_for(s), RecordBatch.of(records), now)
    keys = {t: sorted(k for rows in parts for k in rows.table["key"].to_pylist()) for t, parts in out.events.items()}
    assert keys == {"inv_things": ['{"code":"c0"}', '{"code":"c2"}'], "orders": ['{"id":1}']}


KAFKA = {"type": "kafka", "bootstrap_servers": "127.0.0.1:9092"}
EH_KAFKA = {"type": "eventhubs-kafka", "namespace": "ns", "connection_string": "Endpoint=sb://ns/;SharedAccessKey=k"}


@pytest.mark.parametrize("base", [KAFKA, EH_KAFKA], ids=["kafka", "eventhubs-kafka"])
@pytest.mark.parametrize(
    "topics,says",
    [
        ({}, "give source.topics (a list of topics) or source.topics_pattern (a regex)"),
        ({"topics": ["a"], "topics_pattern": "a.*"}, "source.topics and source.topics_pattern are both set"),
        ({"topics_pattern": "db(["}, "topics_pattern: Value error, 'db([' is not a regular expression"),
        ({"topics": []}, "topics: List should have at least 1 item"),
    ],
)
def test_topics_or_topics_pattern_exactly_one(base, topics, says):
    with pytest.raises(ConfigError) as e:
        load_settings(source=base | topics)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_the_label_names_the_pattern():
    s = load_settings(source=KAFKA | {"topics_pattern": r"db1\.inventory\..*"})
    assert s.source.label() == r"kafka 127.0.0.1:9092 topics_pattern db1\.inventory\..*"
    assert load_settings(source=KAFKA | {"topics": ["a", "b"]}).source.label() == "kafka 127.0.0.1:9092 topics a,b"


def test_the_pattern_matches_whole_names_and_never_internal_topics():
    names = ["__consumer_offsets", "db.inv.a", "db.inv.b", "db.inv.a_old", "xdb.inv.c", "db.other.a", "__x.inv.d"]
    assert matching_topics(names, r"db\.inv\.[a-z]+") == ["db.inv.a", "db.inv.b"]
    assert matching_topics(names, r".*\.inv\..*") == ["db.inv.a", "db.inv.a_old", "db.inv.b", "xdb.inv.c"]
    assert matching_topics(names, r"nothing\..*") == []


def test_the_event_hubs_template_needs_topics_by_name_and_applies_globs():
    pattern = load_settings(source=KAFKA | {"topics_pattern": r"db\.inv\..*"})
    with pytest.raises(QuotaConfigError, match=r"^source\.topics_pattern names no event hubs: .* in source\.topics"):
        template(pattern)
    named = load_settings(
        source=KAFKA | {"topics": ["db.inv.orders", "db.inv.items"]},
        tables={"orders": {"partitions": 2}, "*s": {"partitions": 6}},
    )
    hubs = {
        r["name"]: r["properties"]["partitionCount"]
        for r in template(named)["resources"]
        if r["type"] == "Microsoft.EventHub/namespaces/eventhubs"
    }
    assert hubs == {
        "[concat(parameters('namespaceName'), '/db.inv.orders')]": 2,
        "[concat(parameters('namespaceName'), '/db.inv.items')]": 6,
    }
    # the file source defines the tables named in the settings, not the globs
    files = load_settings(tables={"orders": {}, "inv_*": {"partitions": 3}})
    assert [r["name"] for r in template(files)["resources"] if r["type"].endswith("/eventhubs")] == [
        "[concat(parameters('namespaceName'), '/orders')]"
    ]

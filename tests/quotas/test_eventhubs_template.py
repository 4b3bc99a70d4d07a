"""`cdclake infra eventhubs`: the ARM template against the configuration it came from and the
documented names of the Microsoft.EventHub 2024-01-01 API (no Azure here: the template is
checked as data)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from connector.cli import app
from connector.core.config import load_settings
from quotas.errors import QuotaConfigError
from quotas.eventhubs_template import template

# The writable properties this template may use, as the references of these API versions
# document them (Microsoft.EventHub 2024-01-01, Microsoft.Storage 2023-05-01,
# Microsoft.ManagedIdentity 2023-01-31, Microsoft.Authorization 2022-04-01).
DOCUMENTED = {
    "Microsoft.EventHub/clusters": {"name", "location", "sku", "type", "apiVersion"},
    "Microsoft.EventHub/namespaces": {"name", "location", "sku", "properties", "type", "apiVersion", "dependsOn"},
    "Microsoft.EventHub/namespaces/eventhubs": {"name", "properties", "type", "apiVersion", "dependsOn"},
    "Microsoft.EventHub/namespaces/eventhubs/consumergroups": {"name", "properties", "type", "apiVersion", "dependsOn"},
    "Microsoft.Storage/storageAccounts": {"name", "location", "kind", "sku", "properties", "type", "apiVersion"},
    "Microsoft.Storage/storageAccounts/blobServices/containers": {
        "name",
        "properties",
        "type",
        "apiVersion",
        "dependsOn",
    },  # fmt: skip
    "Microsoft.ManagedIdentity/userAssignedIdentities": {"name", "location", "type", "apiVersion"},
    "Microsoft.Authorization/roleAssignments": {"name", "scope", "properties", "type", "apiVersion", "dependsOn"},
}
API_VERSIONS = {"Microsoft.EventHub": "2024-01-01", "Microsoft.Storage": "2023-05-01"}
API_VERSIONS |= {"Microsoft.ManagedIdentity": "2023-01-31", "Microsoft.Authorization": "2022-04-01"}
ACCOUNT_PROPERTIES = {"isHnsEnabled", "minimumTlsVersion", "allowBlobPublicAccess", "supportsHttpsTrafficOnly"}
ROLE_PROPERTIES = {"roleDefinitionId", "principalId", "principalType"}
NAMESPACE_PROPERTIES = {"kafkaEnabled", "clusterArmId", "disableLocalAuth", "minimumTlsVersion", "zoneRedundant"}
HUB_PROPERTIES = {"partitionCount", "retentionDescription", "messageRetentionInDays", "status", "captureDescription"}
RETENTION = {"cleanupPolicy", "retentionTimeInHours", "tombstoneRetentionTimeInHours"}


def _settings(tables: dict, tier: str = "standard", **compaction):
    return load_settings(
        source={
            "type": "kafka",
            "bootstrap_servers": "127.0.0.1:9092",
            "topics": ["db.inv.orders", "db.inv.items"],
            "group_id": "lake-ingest",
        },
        quotas={"default_tier": tier},
        tables=tables,
        compaction=compaction,
    )


def _by_type(t: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in t["resources"]:
        out.setdefault(r["type"], []).append(r)
    return out


def _documented_only(t: dict) -> None:
    assert t["$schema"].endswith("deploymentTemplate.json#")
    for r in t["resources"]:
        assert r["apiVersion"] == API_VERSIONS[r["type"].split("/")[0]]
        assert set(r) <= DOCUMENTED[r["type"]], r
        if r["type"] == "Microsoft.EventHub/namespaces":
            assert set(r["properties"]) <= NAMESPACE_PROPERTIES
        if r["type"] == "Microsoft.EventHub/namespaces/eventhubs":
            assert set(r["properties"]) <= HUB_PROPERTIES
            assert set(r["properties"]["retentionDescription"]) <= RETENTION
        if r["type"] == "Microsoft.Storage/storageAccounts":
            assert set(r["properties"]) <= ACCOUNT_PROPERTIES
        if r["type"] == "Microsoft.Authorization/roleAssignments":
            assert set(r["properties"]) <= ROLE_PROPERTIES
    assert set(t["outputs"]) == {"warehouse", "identityClientId"}


def test_one_hub_per_topic_with_its_tables_settings():
    s = _settings(
        {"orders": {"partitions": 8}, "items": {"compaction": False, "log_retention_hours": 47.5}},
        tombstone_retention_hours=12.5,
        log_retention_hours=48,
    )
    t = template(s, partitions=3)
    _documented_only(t)
    kinds = _by_type(t)
    (namespace,) = kinds["Microsoft.EventHub/namespaces"]
    assert namespace["sku"]["name"] == "Standard" and namespace["properties"]["kafkaEnabled"] is True
    hubs = {r["name"]: r["properties"] for r in kinds["Microsoft.EventHub/namespaces/eventhubs"]}
    assert hubs == {
        "[concat(parameters('namespaceName'), '/db.inv.orders')]": {
            "partitionCount": 8,
            "retentionDescription": {"cleanupPolicy": "Compact", "tombstoneRetentionTimeInHours": 13},
        },
        "[concat(parameters('namespaceName'), '/db.inv.items')]": {
            "partitionCount": 3,
            "retentionDescription": {"cleanupPolicy": "Delete", "retentionTimeInHours": 48},
        },
    }
    groups = [r["name"] for r in kinds["Microsoft.EventHub/namespaces/eventhubs/consumergroups"]]
    assert groups == [
        "[concat(parameters('namespaceName'), '/db.inv.orders/lake-ingest')]",
        "[concat(parameters('namespaceName'), '/db.inv.items/lake-ingest')]",
    ]


@pytest.mark.parametrize(
    "tier,sku,cluster",
    [("standard", "Standard", False), ("premium", "Premium", False), ("dedicated", "Standard", True)],
)
def test_the_sku_comes_from_the_tier(tier, sku, cluster):
    t = template(_settings({}, tier))
    _documented_only(t)
    kinds = _by_type(t)
    assert kinds["Microsoft.EventHub/namespaces"][0]["sku"]["name"] == sku
    assert ("Microsoft.EventHub/clusters" in kinds) is cluster
    assert ("clusterArmId" in kinds["Microsoft.EventHub/namespaces"][0]["properties"]) is cluster


def test_basic_has_no_compaction_and_no_consumer_group_of_its_own():
    t = template(_settings({"orders": {"compaction": False}, "items": {"compaction": False}}, "basic"))
    kinds = _by_type(t)
    assert kinds["Microsoft.EventHub/namespaces"][0]["sku"]["name"] == "Basic"
    assert "Microsoft.EventHub/namespaces/eventhubs/consumergroups" not in kinds
    assert {
        r["properties"]["retentionDescription"]["cleanupPolicy"]
        for r in kinds["Microsoft.EventHub/namespaces/eventhubs"]
    } == {"Delete"}


@pytest.mark.parametrize(
    "tables,tier,says",
    [
        ({}, "basic", "compaction is not supported on the basic tier"),
        (
            {"orders": {"partitions": 40}},
            "standard",
            "tables.orders.partitions = 40 exceeds the standard tier limit of 32",
        ),
        ({"orders": {"tier": "premium"}}, "standard", "on tiers premium, standard: one namespace has one tier"),
    ],
)
def test_a_config_that_breaks_a_tier_is_refused_with_the_tier_error(tables, tier, says):
    with pytest.raises(QuotaConfigError, match=says):
        template(_settings(tables, tier))


def test_the_cli_writes_the_template(tmp_path, monkeypatch):
    config = tmp_path / "lake.toml"
    config.write_text('[source]\ntype = "kafka"\nbootstrap_servers = "127.0.0.1:9092"\ntopics = ["db.inv.orders"]\n')
    out = tmp_path / "eh.json"
    result = CliRunner().invoke(app, ["infra", "eventhubs", "-c", str(config), "--partitions", "6", "-o", str(out)])
    assert result.exit_code == 0, result.output
    hub = _by_type(json.loads(out.read_text()))["Microsoft.EventHub/namespaces/eventhubs"][0]
    assert hub["properties"]["partitionCount"] == 6
    refused = CliRunner().invoke(
        app, ["infra", "eventhubs", "-c", str(config)], env={"CDCLAKE_QUOTAS__DEFAULT_TIER": "basic"}
    )
    assert refused.exit_code == 1 and "compaction is not supported on the basic tier" in refused.output


def test_the_job_s_storage_and_identity_come_with_the_namespace():
    """An ADLS Gen2 account (hierarchical namespace on) with a container for the warehouse
    and one for the checkpoints, and the job's managed identity with the built-in roles to
    write the one and read the hubs."""
    t = template(_settings({}))
    _documented_only(t)
    kinds = _by_type(t)
    (account,) = kinds["Microsoft.Storage/storageAccounts"]
    assert account["properties"]["isHnsEnabled"] is True and account["kind"] == "StorageV2"
    containers = [r["name"] for r in kinds["Microsoft.Storage/storageAccounts/blobServices/containers"]]
    assert [c.split("parameters('")[-1].split("'")[0] for c in containers] == [
        "warehouseContainer",
        "checkpointContainer",
    ]
    assert {t["parameters"][p]["defaultValue"] for p in ("warehouseContainer", "checkpointContainer")} == {
        "lake", "checkpoints"
    }  # fmt: skip
    roles = {
        r["properties"]["roleDefinitionId"].split("'")[-2]: r["scope"]
        for r in kinds["Microsoft.Authorization/roleAssignments"]
    }
    account_id = "resourceId('Microsoft.Storage/storageAccounts', parameters('storageAccountName'))"
    namespace_id = "resourceId('Microsoft.EventHub/namespaces', parameters('namespaceName'))"
    assert roles == {
        "ba92f5b4-2d11-453d-a403-e96b0029c9fe": f"[{account_id}]",  # Storage Blob Data Contributor
        "a638d3c7-ab3a-418d-83e6-5f17a39d4fde": f"[{namespace_id}]",  # Azure Event Hubs Data Receiver
    }
    assert all("principalId" in r["properties"] for r in kinds["Microsoft.Authorization/roleAssignments"])
    assert ".dfs.core.windows.net/cdc" in t["outputs"]["warehouse"]["value"]

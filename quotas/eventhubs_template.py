"""Event Hubs definitions from the tier configuration: an ARM template (JSON) with the
namespace of a tier and one event hub per source topic, as the connector expects them.

Resource types and property names are those of the `Microsoft.EventHub` 2024-01-01 API:
`namespaces` (SKU from the tier; a Dedicated tier's namespace lives in a `clusters`
resource), `namespaces/eventhubs` (`partitionCount`, `retentionDescription`) and
`namespaces/eventhubs/consumergroups`. A table with compaction gets `cleanupPolicy =
"Compact"` with `tombstoneRetentionTimeInHours`; the service ignores `retentionTimeInHours`
for a compacted hub, so it is set only on a hub without compaction (`Delete`), from the
table's log retention. Every table is checked against its tier first (`ledger.validate`).

The same template holds the storage the job keeps on Azure (`storage`): an ADLS Gen2
account (`Microsoft.Storage/storageAccounts` 2023-05-01, `isHnsEnabled`), a container for
the warehouse and one for the Event Hubs checkpoints, and a user-assigned managed identity
for the job (`Microsoft.ManagedIdentity` 2023-01-31) given the built-in roles Storage Blob
Data Contributor on the account and Azure Event Hubs Data Receiver on the namespace
(`Microsoft.Authorization/roleAssignments` 2022-04-01). Its outputs are the warehouse URI
and the identity's client id, for `catalog.warehouse` and `AZURE_CLIENT_ID`.
"""

from __future__ import annotations

import math
from typing import Any

from connector.core.config import Settings
from connector.core.records import topic_table
from connector.core.source_config import EventHubsSourceConfig, KafkaCommonConfig
from quotas.errors import QuotaConfigError
from quotas.ledger import validate

API = "2024-01-01"
SCHEMA = "https://schema.management.azure.com/schemas/2019-04-01/deploymentTemplate.json#"
SKUS = {"basic": "Basic", "standard": "Standard", "premium": "Premium", "dedicated": "Standard"}
NS = "parameters('namespaceName')"


def hubs(settings: Settings) -> list[str]:
    """The event hubs the source reads: its topics, else the tables named in the settings."""
    source = settings.source
    if isinstance(source, KafkaCommonConfig):
        if source.topics is None:  # a pattern may match hubs that do not exist yet: no names to define
            raise QuotaConfigError(
                "source.topics_pattern names no event hubs: give the template a config that lists them in "
                "source.topics, in place of the pattern"
            )
        return list(source.topics)
    if isinstance(source, EventHubsSourceConfig):
        return [source.label().rsplit("/", 1)[-1]]
    return sorted(settings.named_tables())


def consumer_group(settings: Settings) -> str:
    source = settings.source
    if isinstance(source, KafkaCommonConfig):
        return source.group_id
    if isinstance(source, EventHubsSourceConfig):
        return source.consumer_group
    return "cdclake"


def template(settings: Settings, partitions: int = 4) -> dict[str, Any]:
    """The ARM template; `partitions` for hubs whose table sets none. Raises QuotaConfigError
    (naming the table, setting, tier and limit) when a table breaks its tier, or when the
    hubs' tables are on different tiers (one namespace has one tier)."""
    tables = {hub: topic_table(hub, settings.limits.max_table_name_length) for hub in hubs(settings)}
    if not tables:
        raise QuotaConfigError("no event hubs to define: the source names no topics and no [tables.<t>] are set")
    quotas = {hub: validate(settings, table) for hub, table in tables.items()}
    tiers = sorted({q.name for q in quotas.values()})
    if len(tiers) > 1:
        raise QuotaConfigError(
            f"the hubs' tables are on tiers {', '.join(tiers)}: one namespace has one tier; set "
            "[tables.<t>] tier alike, or define each tier's hubs from a config of their own"
        )
    tier = tiers[0]
    if tier not in SKUS:
        raise QuotaConfigError(f"tier {tier!r} is a custom tier: it has no Event Hubs SKU to define")
    group = consumer_group(settings)
    parameters: dict[str, Any] = {
        "namespaceName": {"type": "string", "metadata": {"description": "the Event Hubs namespace"}},
        "location": {"type": "string", "defaultValue": "[resourceGroup().location]"},
    }
    namespace: dict[str, Any] = {
        "type": "Microsoft.EventHub/namespaces",
        "apiVersion": API,
        "name": f"[{NS}]",
        "location": "[parameters('location')]",
        "sku": {"name": SKUS[tier], "tier": SKUS[tier], "capacity": 1},
        "properties": {"kafkaEnabled": tier != "basic"},
    }
    resources: list[dict[str, Any]] = []
    if tier == "dedicated":
        parameters["clusterName"] = {"type": "string", "metadata": {"description": "the Event Hubs cluster"}}
        cluster = "resourceId('Microsoft.EventHub/clusters', parameters('clusterName'))"
        resources.append(
            {
                "type": "Microsoft.EventHub/clusters",
                "apiVersion": API,
                "name": "[parameters('clusterName')]",
                "location": "[parameters('location')]",
                "sku": {"name": "Dedicated", "capacity": 1},
            }
        )
        namespace["dependsOn"] = [f"[{cluster}]"]
        namespace["properties"]["clusterArmId"] = f"[{cluster}]"
    resources.append(namespace)
    for hub, table in tables.items():
        cfg = settings.table(table)
        compacted = cfg.compaction
        hours = cfg.log_retention_hours or settings.compaction.log_retention_hours
        retention: dict[str, Any] = (
            {
                "cleanupPolicy": "Compact",
                "tombstoneRetentionTimeInHours": math.ceil(settings.compaction.tombstone_retention_hours),
            }
            if compacted
            else {"cleanupPolicy": "Delete", "retentionTimeInHours": math.ceil(hours)}
        )
        resources.append(
            {
                "type": "Microsoft.EventHub/namespaces/eventhubs",
                "apiVersion": API,
                "name": f"[concat({NS}, '/{hub}')]",
                "dependsOn": [f"[resourceId('Microsoft.EventHub/namespaces', {NS})]"],
                "properties": {
                    "partitionCount": cfg.partitions or partitions,
                    "retentionDescription": retention,
                },
            }
        )
        if group != "$Default" and tier != "basic":  # basic has only $Default
            resources.append(
                {
                    "type": "Microsoft.EventHub/namespaces/eventhubs/consumergroups",
                    "apiVersion": API,
                    "name": f"[concat({NS}, '/{hub}/{group}')]",
                    "dependsOn": [f"[resourceId('Microsoft.EventHub/namespaces/eventhubs', {NS}, '{hub}')]"],
                    "properties": {},
                }
            )
    more, held, outputs = storage()
    return {
        "$schema": SCHEMA,
        "contentVersion": "1.0.0.0",
        "parameters": parameters | more,
        "resources": resources + held,
        "outputs": outputs,
    }


STORAGE_API, IDENTITY_API, ROLE_API = "2023-05-01", "2023-01-31", "2022-04-01"
BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
EVENTHUBS_DATA_RECEIVER = "a638d3c7-ab3a-418d-83e6-5f17a39d4fde"
ACCOUNT = "parameters('storageAccountName')"
ROLE_DEFINITIONS, DFS_HOST = "'Microsoft.Authorization/roleDefinitions'", ".dfs.core.windows.net"


def storage() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """The storage account, its containers, the job's identity and its role assignments (the
    module docstring): their parameters, resources and outputs."""
    account_id = f"resourceId('Microsoft.Storage/storageAccounts', {ACCOUNT})"
    identity_id = "resourceId('Microsoft.ManagedIdentity/userAssignedIdentities', parameters('identityName'))"
    principal = f"[reference({identity_id}, '{IDENTITY_API}').principalId]"
    parameters = {
        "storageAccountName": {"type": "string", "metadata": {"description": "the ADLS Gen2 account"}},
        "warehouseContainer": {"type": "string", "defaultValue": "lake"},
        "checkpointContainer": {"type": "string", "defaultValue": "checkpoints"},
        "identityName": {"type": "string", "defaultValue": "cdclake"},
    }
    resources: list[dict[str, Any]] = [
        {
            "type": "Microsoft.Storage/storageAccounts",
            "apiVersion": STORAGE_API,
            "name": f"[{ACCOUNT}]",
            "location": "[parameters('location')]",
            "kind": "StorageV2",
            "sku": {"name": "Standard_LRS"},
            "properties": {
                "isHnsEnabled": True,
                "minimumTlsVersion": "TLS1_2",
                "allowBlobPublicAccess": False,
                "supportsHttpsTrafficOnly": True,
            },
        },
        *[
            {
                "type": "Microsoft.Storage/storageAccounts/blobServices/containers",
                "apiVersion": STORAGE_API,
                "name": f"[concat({ACCOUNT}, '/default/', parameters('{container}'))]",
                "dependsOn": [f"[{account_id}]"],
                "properties": {"publicAccess": "None"},
            }
            for container in ("warehouseContainer", "checkpointContainer")
        ],
        {
            "type": "Microsoft.ManagedIdentity/userAssignedIdentities",
            "apiVersion": IDENTITY_API,
            "name": "[parameters('identityName')]",
            "location": "[parameters('location')]",
        },
    ]
    namespace_id = f"resourceId('Microsoft.EventHub/namespaces', {NS})"
    for role, scope_id in ((BLOB_DATA_CONTRIBUTOR, account_id), (EVENTHUBS_DATA_RECEIVER, namespace_id)):
        resources.append(
            {
                "type": "Microsoft.Authorization/roleAssignments",
                "apiVersion": ROLE_API,
                "name": f"[guid({scope_id}, parameters('identityName'), '{role}')]",
                "scope": f"[{scope_id}]",
                "dependsOn": [f"[{scope_id}]", f"[{identity_id}]"],
                "properties": {
                    "roleDefinitionId": f"[subscriptionResourceId({ROLE_DEFINITIONS}, '{role}')]",
                    "principalId": principal,
                    "principalType": "ServicePrincipal",
                },
            }
        )
    outputs: dict[str, Any] = {
        "warehouse": {
            "type": "string",
            "value": f"[concat('abfss://', parameters('warehouseContainer'), '@', {ACCOUNT}, '{DFS_HOST}/cdc')]",
        },
        "identityClientId": {"type": "string", "value": f"[reference({identity_id}, '{IDENTITY_API}').clientId]"},
    }
    return parameters, resources, outputs

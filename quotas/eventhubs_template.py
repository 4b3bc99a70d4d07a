"""Event Hubs definitions from the tier configuration: an ARM template (JSON) with the
namespace of a tier and one event hub per source topic, as the connector expects them.

Resource types and property names are those of the `Microsoft.EventHub` 2024-01-01 API:
`namespaces` (SKU from the tier; a Dedicated tier's namespace lives in a `clusters`
resource), `namespaces/eventhubs` (`partitionCount`, `retentionDescription`) and
`namespaces/eventhubs/consumergroups`. A table with compaction gets `cleanupPolicy =
"Compact"` with `tombstoneRetentionTimeInHours`; the service ignores `retentionTimeInHours`
for a compacted hub, so it is set only on a hub without compaction (`Delete`), from the
table's log retention. Every table is checked against its tier first (`ledger.validate`).
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
    return {"$schema": SCHEMA, "contentVersion": "1.0.0.0", "parameters": parameters, "resources": resources}

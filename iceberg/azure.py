"""A warehouse on Azure Data Lake Storage Gen2 (or Blob storage): the credentials of
`catalog.azure` as the FileIO properties of pyiceberg (adlfs) and of Iceberg's `ADLSFileIO`
in Spark, which name them differently.

- pyiceberg takes the connection string whole (`adls.connection-string`), or the account
  name with its key or a SAS token; with none of them adlfs uses `DefaultAzureCredential`.
- `ADLSFileIO` takes, per account host (`<account>.dfs.core.windows.net`), an endpoint
  (`adls.connection-string.<host>`: the connection string's BlobEndpoint, e.g. Azurite's) and
  a SAS token (`adls.sas-token.<host>`), or the shared key (`adls.auth.shared-key.account.*`);
  with none of them it uses `DefaultAzureCredential`.

Pure: the settings in, the properties out (they hold the secrets: never logged; Spark's
redaction covers the keys that hold them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlparse

if TYPE_CHECKING:
    from connector.core.config import CatalogConfig

SCHEMES = ("abfs://", "abfss://")
ADLS_FILE_IO = "org.apache.iceberg.azure.adlsv2.ADLSFileIO"


def on_azure(warehouse: str) -> bool:
    return warehouse.startswith(SCHEMES)


def account_host(warehouse: str) -> str:
    """`<account>.dfs.core.windows.net` of `abfss://<container>@<account>.dfs.core.windows.net/...`."""
    return urlparse(warehouse).hostname or ""


def connection_parts(connection_string: str) -> dict[str, str]:
    """A storage connection string's `Key=Value` parts (a value may hold `=`)."""
    parts = (p.split("=", 1) for p in connection_string.split(";") if "=" in p)
    return {k.strip(): v.strip() for k, v in parts}


def pyiceberg_properties(catalog: CatalogConfig, warehouse: str) -> dict[str, str]:
    azure, account = catalog.azure, account_host(warehouse).split(".")[0]
    if azure.connection_string is not None:
        return {"adls.connection-string": azure.connection_string.get_secret_value()}
    if azure.account_key is not None:
        return {"adls.account-name": account, "adls.account-key": azure.account_key.get_secret_value()}
    if azure.sas_token is not None:
        return {"adls.account-name": account, "adls.sas-token": azure.sas_token.get_secret_value().lstrip("?")}
    return {"adls.account-name": account}


def spark_properties(catalog: CatalogConfig, warehouse: str) -> dict[str, str]:
    azure, host = catalog.azure, account_host(warehouse)
    props = {"io-impl": ADLS_FILE_IO}
    name, key, sas = host.split(".")[0], None, None
    if azure.connection_string is not None:
        parts = connection_parts(azure.connection_string.get_secret_value())
        if parts.get("BlobEndpoint"):
            props[f"adls.connection-string.{host}"] = parts["BlobEndpoint"]
        name, key, sas = parts.get("AccountName", name), parts.get("AccountKey"), parts.get("SharedAccessSignature")
    elif azure.account_key is not None:
        key = azure.account_key.get_secret_value()
    elif azure.sas_token is not None:
        sas = azure.sas_token.get_secret_value()
    if sas:
        props[f"adls.sas-token.{host}"] = sas.lstrip("?")
    elif key:
        props |= {"adls.auth.shared-key.account.name": name, "adls.auth.shared-key.account.key": key}
    return props

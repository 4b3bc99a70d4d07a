"""The credentials of `catalog.azure` as pyiceberg's (adlfs) and Iceberg's ADLSFileIO's
properties, for each way of giving them, against the names each library documents; the
configuration takes one of them, for a warehouse on Azure only, and never shows it."""

from __future__ import annotations

import pytest

from connector.core.config import load_settings
from connector.core.errors import ConfigError
from iceberg.catalog import storage_properties

WAREHOUSE = "abfss://lake@acct.dfs.core.windows.net/cdc"
HOST = "acct.dfs.core.windows.net"
AZURITE = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=k3y==;"
    "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
)
SAS = (
    "DefaultEndpointsProtocol=https;AccountName=acct;SharedAccessSignature=sv=2024&sig=s1g%3D;"
    "EndpointSuffix=core.windows.net"
)


@pytest.mark.parametrize(
    "azure, pyiceberg, spark",
    [
        (  # none: DefaultAzureCredential on both sides
            {},
            {"adls.account-name": "acct"},
            {},
        ),
        (
            {"account_key": "k3y=="},
            {"adls.account-name": "acct", "adls.account-key": "k3y=="},
            {"adls.auth.shared-key.account.name": "acct", "adls.auth.shared-key.account.key": "k3y=="},
        ),
        (
            {"sas_token": "?sv=2024&sig=s1g%3D"},
            {"adls.account-name": "acct", "adls.sas-token": "sv=2024&sig=s1g%3D"},
            {f"adls.sas-token.{HOST}": "sv=2024&sig=s1g%3D"},
        ),
        (  # Azurite's: its blob endpoint and the shared key
            {"connection_string": AZURITE},
            {"adls.connection-string": AZURITE},
            {
                f"adls.connection-string.{HOST}": "http://127.0.0.1:10000/devstoreaccount1",
                "adls.auth.shared-key.account.name": "devstoreaccount1",
                "adls.auth.shared-key.account.key": "k3y==",
            },
        ),
        (  # a SAS connection string: the default endpoint, the token
            {"connection_string": SAS},
            {"adls.connection-string": SAS},
            {f"adls.sas-token.{HOST}": "sv=2024&sig=s1g%3D"},
        ),
    ],
)
def test_each_credential_reaches_both_libraries_by_their_names(azure, pyiceberg, spark):
    settings = load_settings(
        catalog={"warehouse": WAREHOUSE, "azure": azure, "properties": {"adls.read.block-size-bytes": "1"}}
    )
    assert storage_properties(settings) == pyiceberg | {"adls.read.block-size-bytes": "1"}
    adls_file_io = {"io-impl": "org.apache.iceberg.azure.adlsv2.ADLSFileIO"}
    assert storage_properties(settings, spark=True) == adls_file_io | spark | {"adls.read.block-size-bytes": "1"}
    assert "k3y" not in repr(settings) and "s1g" not in repr(settings)


@pytest.mark.parametrize(
    "catalog, error",
    [
        (
            {"warehouse": WAREHOUSE, "azure": {"account_key": "a", "sas_token": "b"}},
            "give one of account_key, sas_token",
        ),
        ({"azure": {"account_key": "a"}}, "catalog.azure is for a warehouse on Azure"),
        ({"warehouse": "abfss://acct.dfs.core.windows.net/cdc"}, "abfss://<container>@<account>"),
    ],
)
def test_the_configuration_takes_one_credential_for_a_warehouse_on_azure(catalog, error):
    with pytest.raises(ConfigError, match=error) as e:
        load_settings(catalog=catalog)
    assert "b'" not in str(e.value)


def test_duckdb_says_it_does_not_read_a_warehouse_on_azure():
    from iceberg.duckdb_query import connect

    with pytest.raises(ConfigError, match="--engine spark"):
        connect({}, WAREHOUSE)

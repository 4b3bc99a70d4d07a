"""The catalog's settings as pyiceberg's and Spark's properties: a REST catalog's URI and
secrets under the names both use, a SQL catalog's database as Iceberg's JdbcCatalog names
it; the leases' database for each; what the configuration refuses."""

from __future__ import annotations

import re

import pytest

from connector.core.config import load_settings
from connector.core.errors import ConfigError
from iceberg.catalog import rest_properties, spark_catalog_properties
from iceberg.spark import spark_conf


def test_a_rest_catalog_gives_both_sides_its_uri_and_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("CDCLAKE_CATALOG__CREDENTIAL", "client:s3cr3t")
    s = load_settings(
        work_dir=tmp_path,
        catalog={"type": "rest", "uri": "https://catalog.example.com/api", "oauth2_server_uri": "https://idp/token"},
    )
    want = {
        "uri": "https://catalog.example.com/api",
        "credential": "client:s3cr3t",
        "oauth2-server-uri": "https://idp/token",
    }
    assert rest_properties(s) == want
    assert spark_catalog_properties(s) == {"type": "rest", **want}
    assert s.leases_uri == f"sqlite:///{tmp_path.resolve() / 'leases.db'}"
    assert "s3cr3t" not in repr(s)
    conf = spark_conf(s)  # Spark's redaction covers every key that carries a secret
    secret_keys = [k for k, v in conf.items() if "s3cr3t" in v]
    assert secret_keys == ["spark.sql.catalog.lake.credential"]
    assert all(re.search(conf["spark.redaction.regex"], k) for k in secret_keys)


@pytest.mark.parametrize(
    "catalog, tokens",
    [
        ({"credential": "client:s3cr3t"}, "https://catalog.example.com/api/v1/oauth/tokens"),
        ({"credential": "client:s3cr3t", "oauth2_server_uri": "https://idp/token"}, "https://idp/token"),
        ({"token": "t0ken"}, None),
        ({}, None),
    ],
)
def test_a_credential_gets_its_tokens_from_the_named_endpoint(tmp_path, catalog, tokens):
    """Both clients' default token endpoint (the catalog's own) is deprecated: it is named."""
    s = load_settings(work_dir=tmp_path, catalog={"type": "rest", "uri": "https://catalog.example.com/api/", **catalog})
    assert rest_properties(s).get("oauth2-server-uri") == tokens


def test_a_sql_catalog_keeps_its_leases_in_its_own_database(tmp_path):
    s = load_settings(work_dir=tmp_path)
    assert s.leases_uri == s.catalog_uri
    props = spark_catalog_properties(s)
    assert props["type"] == "jdbc" and props["uri"] == f"jdbc:sqlite:{tmp_path.resolve() / 'catalog.db'}"


@pytest.mark.parametrize(
    "catalog, error",
    [
        ({"type": "rest"}, 'catalog.type = "rest" needs catalog.uri'),
        ({"type": "rest", "uri": "sqlite:////x.db"}, 'catalog.type = "rest" needs catalog.uri'),
        ({"uri": "https://catalog.example.com"}, 'or type = "rest"'),
        ({"type": "rest", "uri": "https://c", "leases_uri": "mysql://x"}, "catalog.leases_uri"),
        ({"type": "rest", "uri": "https://user:hunter2@c"}, "holds a password"),
    ],
)
def test_the_configuration_refuses_a_catalog_it_cannot_open(catalog, error):
    with pytest.raises(ConfigError, match=error) as e:
        load_settings(catalog=catalog)
    assert "hunter2" not in str(e.value)


def test_a_rest_catalog_that_does_not_answer_is_one_line_naming_it(tmp_path):
    import socket

    from connector.core.errors import ConnectorError
    from iceberg.catalog import load_catalog

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    settings = load_settings(work_dir=tmp_path, catalog={"type": "rest", "uri": uri})
    with pytest.raises(ConnectorError) as e:
        load_catalog(settings)
    assert len(str(e.value).splitlines()) == 1 and uri in str(e.value) and "catalog.uri" in str(e.value)

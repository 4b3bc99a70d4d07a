"""A local warehouse's files in Spark go through `cdclake.LocalFileIO` (infra/delta-writer),
Java's file API, and not through Hadoop's local file system, which starts a `chmod` process
for each file and directory it creates and writes a `.crc` checksum file beside each."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from connector.core.config import load_settings
from iceberg.catalog import load_catalog
from iceberg.spark import file_io


def test_a_local_warehouse_takes_the_java_file_io_unless_one_is_configured():
    assert file_io(load_settings())["io-impl"] == "cdclake.LocalFileIO"
    assert file_io(load_settings(catalog={"warehouse": "/data/lake"}))["io-impl"] == "cdclake.LocalFileIO"
    s3 = load_settings(catalog={"warehouse": "s3://bucket/lake"})
    assert file_io(s3)["io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    own = load_settings(catalog={"properties": {"io-impl": "org.apache.iceberg.hadoop.HadoopFileIO"}})
    assert file_io(own)["io-impl"] == "org.apache.iceberg.hadoop.HadoopFileIO"


@pytest.mark.spark
def test_a_table_spark_writes_in_a_local_warehouse_has_only_icebergs_files_and_pyiceberg_reads_it(spark, settings):
    """Its data files, deletion vectors, manifests and metadata are where the metadata says
    (`file:` locations), with no checksum file beside them; the rows pyiceberg reads are the
    ones written, less the row deleted by position; a file gone is Iceberg's not-found error."""
    ns = f"{settings.catalog.name}.{settings.catalog.namespace}"
    table = f"{ns}.local_files"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {ns}")
    props = "'format-version'='3', 'write.delete.mode'='merge-on-read'"
    spark.sql(f"CREATE TABLE {table} (k string, v bigint) USING iceberg TBLPROPERTIES ({props})")
    spark.sql(f"INSERT INTO {table} VALUES ('a', 1), ('b', 2), ('c', 3)")
    spark.sql(f"DELETE FROM {table} WHERE k = 'b'")
    jvm = spark.sparkContext._jvm
    loaded = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, table)
    assert loaded.io().getClass().getName() == "cdclake.LocalFileIO"

    def local(location: str) -> Path:
        assert location.startswith("file:"), location
        return Path(unquote(urlparse(location).path))

    named = {r[0] for r in spark.sql(f"SELECT file_path FROM {table}.all_files").collect()}
    named |= {r[0] for r in spark.sql(f"SELECT path FROM {table}.all_manifests").collect()}
    named |= {r[0] for r in spark.sql(f"SELECT manifest_list FROM {table}.snapshots").collect()}
    assert any(p.endswith(".puffin") for p in named)  # the delete's deletion vector
    on_disk = {p for p in local(loaded.location()).rglob("*") if p.is_file()}
    assert {local(p) for p in named} <= on_disk
    assert not [p for p in on_disk if p.name.endswith(".crc")]

    read = load_catalog(settings).load_table(f"{settings.catalog.namespace}.local_files").scan().to_arrow()
    assert sorted(zip(read["k"].to_pylist(), read["v"].to_pylist())) == [("a", 1), ("c", 3)]

    data = next(p for p in named if p.endswith(".parquet"))
    local(data).rename(local(data).with_name("moved.parquet"))
    with pytest.raises(Exception, match="NotFoundException"):
        spark.table(table).collect()

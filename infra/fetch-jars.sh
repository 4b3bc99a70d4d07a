#!/usr/bin/env bash
# Resolves Spark's JVM jars (infra/pom.xml) from Maven Central into .cache/jars (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
out=.cache/jars
if ls "$out"/iceberg-spark-runtime-*.jar >/dev/null 2>&1 && [ "$out/.stamp" -nt infra/pom.xml ]; then
  exit 0
fi
command -v java >/dev/null || { echo "java not found: install a JDK 17+ (apt-get install openjdk-17-jdk-headless)" >&2; exit 1; }
command -v mvn >/dev/null || { echo "mvn not found: install Maven (apt-get install maven)" >&2; exit 1; }
rm -rf "$out" && mkdir -p "$out"
echo "fetching Spark jars (iceberg-spark-runtime, iceberg-aws-bundle, iceberg-azure-bundle, sqlite-jdbc, postgresql, spark-sql-kafka) with Maven into $out" >&2
mvn -q -B -s infra/maven-settings.xml -f infra/pom.xml dependency:copy-dependencies -DoutputDirectory="$PWD/$out" -DincludeScope=runtime
touch "$out/.stamp"

#!/usr/bin/env bash
# Resolves Spark's JVM jars (infra/pom.xml) from Maven Central into .cache/jars (git-ignored),
# and compiles the compaction's writer (infra/delta-writer) beside them.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.cache/jars
helpers=infra/delta-writer
command -v javac >/dev/null || { echo "javac not found: install a JDK 17+ (apt-get install openjdk-17-jdk-headless)" >&2; exit 1; }
if ! ls "$out"/iceberg-spark-runtime-*.jar >/dev/null 2>&1 || [ ! "$out/.stamp" -nt infra/pom.xml ]; then
  command -v mvn >/dev/null || { echo "mvn not found: install Maven (apt-get install maven)" >&2; exit 1; }
  rm -rf "$out" && mkdir -p "$out"
  echo "fetching Spark jars (iceberg-spark-runtime, iceberg-aws-bundle, iceberg-azure-bundle, sqlite-jdbc, postgresql, spark-sql-kafka) with Maven into $out" >&2
  mkdir -p "$HOME/.m2"   # one resolution at a time into Maven's cache (set-ups may run at once)
  lock=() && command -v flock >/dev/null && lock=(flock "$HOME/.m2/.cdclake-fetch.lock")
  "${lock[@]}" mvn -q -B -s infra/maven-settings.xml -f infra/pom.xml dependency:copy-dependencies -DoutputDirectory="$PWD/$out" -DincludeScope=runtime
  touch "$out/.stamp"
fi
if [ ! "$out/cdclake-delta-writer.jar" -nt "$out/.stamp" ] || [ -n "$(find "$helpers" -name '*.java' -newer "$out/cdclake-delta-writer.jar")" ]; then
  # against the Iceberg runtime above and PySpark's own Spark jars (in .venv before this runs)
  spark_jars="$(.venv/bin/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
  classes="$(mktemp -d)"
  javac -nowarn --release 17 -d "$classes" -cp "$(ls "$out"/iceberg-spark-runtime-*.jar):$spark_jars/*" "$helpers"/*.java
  jar cf "$out/cdclake-delta-writer.jar" -C "$classes" .
  rm -rf "$classes"
fi
# the driver JVM's class archive, written by a run of the demo once the jars above are in place
.venv/bin/python infra/class_archive.py || echo "no class archive written: Spark starts without one, slower" >&2

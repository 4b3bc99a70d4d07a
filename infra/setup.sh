#!/usr/bin/env bash
# One-time (and idempotent) set-up: .venv with the pinned packages, Spark's JVM jars, and what
# the tests start (PostgreSQL, the Kafka broker's jars, Azurite).
#   bash infra/setup.sh             # development and tests
#   bash infra/setup.sh --runtime   # what the connector needs to run (the image's build step)
set -euo pipefail
cd "$(dirname "$0")/.."
runtime=false
[ "${1:-}" = "--runtime" ] && runtime=true
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
extras='[test]'
$runtime && extras=''
stamp=.venv/.stamp-test
$runtime && stamp=.venv/.stamp-runtime   # a runtime set-up does not stand for the tests' packages
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  # uv links the packages from its cache (~/.cache/uv) where pip unpacks them again (PySpark
  # alone is 400 MB). From the cache alone first: online, uv revalidates each package with the
  # index (about 12 s) and may build PySpark's wheel from its source again (about 25 s; PyPI has
  # only the source); the pins are exact, and uv goes online when something is not cached.
  # Bytecode compiled: where PYTHONDONTWRITEBYTECODE is set (many CI and container environments)
  # no import writes it, and each command and Spark Python worker compiles its imports again
  # (the CLI's: about 5 s against 1.7 s).
  .venv/bin/pip install -q --disable-pip-version-check "uv==0.13.9"   # the pinned uv, whatever .venv had
  uv=(.venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python -e ".$extras")
  "${uv[@]}" --offline 2>/dev/null || "${uv[@]}"
  touch "$stamp"
fi
.venv/bin/python -m compileall -q -j 0 connector iceberg quotas >/dev/null   # the project's own, as above
bash infra/fetch-jars.sh
$runtime && exit 0
.venv/bin/python -m compileall -q -j 0 tests infra >/dev/null   # what the tests' processes import
# PostgreSQL (the production catalog's tests): Debian's server, stopped again after install
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing PostgreSQL (apt-get install postgresql)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) \
      || echo "PostgreSQL could not be installed: its tests are skipped" >&2
    service postgresql stop >/dev/null 2>&1 || true
  else
    echo "no PostgreSQL server (apt-get install postgresql as root): its tests are skipped" >&2
  fi
fi
.venv/bin/python infra/kafka_broker.py fetch >/dev/null   # broker jars for the Kafka tests
.venv/bin/python infra/rest_catalog.py fetch >/dev/null   # Iceberg's REST catalog server for its tests
# Azurite (Azure Blob emulator) for the checkpoint-store tests; 3.35 is the last for Node 20.
# npm installs it once into the user's cache (about 30 s, 24,000 files), copied from there.
if [ ! -x .cache/node/node_modules/.bin/azurite-blob ]; then
  kept="$HOME/.cache/cdclake/azurite-3.35.0"
  if [ ! -x "$kept/node_modules/.bin/azurite-blob" ]; then
    rm -rf "$kept.tmp" && mkdir -p "$kept.tmp"
    npm install --prefix "$kept.tmp" --no-audit --no-fund --silent azurite@3.35.0
    rm -rf "$kept" && mv "$kept.tmp" "$kept"
  fi
  rm -rf .cache/node && mkdir -p .cache && cp -a "$kept" .cache/node
fi

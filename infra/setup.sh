#!/usr/bin/env bash
# One-time (and idempotent) set-up: .venv with the pinned packages, Spark's JVM jars.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if [ ! -f .venv/.stamp ] || [ pyproject.toml -nt .venv/.stamp ]; then
  .venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
  touch .venv/.stamp
fi
bash infra/fetch-jars.sh
.venv/bin/python infra/kafka_broker.py fetch >/dev/null   # broker jars for the Kafka tests
# Azurite (Azure Blob emulator) for the checkpoint-store tests; 3.35 is the last for Node 20.
if [ ! -x .cache/node/node_modules/.bin/azurite-blob ]; then
  npm install --prefix .cache/node --no-audit --no-fund --silent azurite@3.35.0
fi

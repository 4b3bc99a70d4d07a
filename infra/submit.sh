#!/usr/bin/env bash
# Runs a cdclake command as a Spark application with spark-submit: the project's resolved jars
# (.cache/jars, infra/pom.xml) on the driver and executors, the venv's Python on both, and the
# project's packages shipped to the executors by the job itself.
#
#   infra/submit.sh [spark-submit options] -- <cdclake command and options>
#   infra/submit.sh --master spark://127.0.0.1:7077 --driver-memory 4g -- run -c cdclake.toml --every 60
#
# Leave `[spark] master` unset in the config: the --master given here is the one used.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
opts=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
[ $# -gt 0 ] || { echo "usage: infra/submit.sh [spark-submit options] -- <cdclake command>" >&2; exit 2; }
shift
py=${PYSPARK_PYTHON:-$root/.venv/bin/python}
export PYSPARK_PYTHON=$py PYSPARK_DRIVER_PYTHON=$py
jars=$(ls "$root"/.cache/jars/*.jar | paste -sd, -)
exec "$root/.venv/bin/spark-submit" --jars "$jars" "${opts[@]}" "$root/connector/cli.py" "$@"

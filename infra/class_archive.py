#!/usr/bin/env python3
"""The driver JVM's class archive (Java's application class-data sharing, a dynamic archive):
the classes a run of the demo loads, parsed and verified once and mapped by every later driver
JVM (`iceberg.spark`: `-XX:SharedArchiveFile` when the archive is there). A `cdclake` command
then starts its Spark session and runs its first queries in about half the time (with the
jars on its class path: `iceberg.spark.jars_conf`).

    python infra/class_archive.py        # (re)writes .cache/jars/cdclake-classes.jsa when stale

The archive is stale when a jar, PySpark's jars or the `java` binary is newer than it; the JVM
checks it again itself, and one it refuses (another JVM, a changed jar) only costs the sharing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iceberg.spark import CLASS_ARCHIVE, DEFAULT_JARS_DIR, JAVA_OPTIONS  # noqa: E402


def _inputs() -> list[Path]:
    import pyspark

    java = shutil.which("java")
    jars = [*DEFAULT_JARS_DIR.glob("*.jar"), *(Path(pyspark.__file__).parent / "jars").glob("*.jar")]
    code = [ROOT / "iceberg" / "spark.py", Path(__file__).resolve()]  # the JVM's class path and options
    return jars + code + ([Path(java).resolve()] if java else [])


def stale(target: Path) -> bool:
    return not target.exists() or any(p.stat().st_mtime > target.stat().st_mtime for p in _inputs())


def write(target: Path) -> None:
    """Runs the demo in a driver JVM that writes the classes it loaded to `target` as it exits."""
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as work:
        options = f"{JAVA_OPTIONS} -XX:ArchiveClassesAtExit={partial}"
        env = {**os.environ, "CDCLAKE_SPARK__CONF": json.dumps({"spark.driver.extraJavaOptions": options})}
        code = (
            "import sys; from pathlib import Path; from pyspark import SparkContext; from connector.demo import demo\n"
            "demo(Path(sys.argv[1]))\n"
            "gateway = SparkContext._gateway; SparkContext._active_spark_context.stop(); gateway.shutdown()\n"
            "gateway.proc.stdin.close(); gateway.proc.wait()  # the JVM writes the archive as it exits"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, str(Path(work) / "demo")], env=env, cwd=ROOT, capture_output=True, text=True
        )
    if done.returncode or not partial.exists():
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"the demo's driver JVM wrote no class archive at {partial} (its output above)")
    partial.replace(target)


def main() -> None:
    target = DEFAULT_JARS_DIR / CLASS_ARCHIVE
    if stale(target):
        print(f"writing the driver JVM's class archive {target} (a run of the demo)", file=sys.stderr)
        write(target)


if __name__ == "__main__":
    main()

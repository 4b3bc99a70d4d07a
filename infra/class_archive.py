#!/usr/bin/env python3
"""The driver JVM's class archive (Java's application class-data sharing, a dynamic archive):
the classes a run of the demo loads, parsed and verified once and mapped by every later local
driver JVM (`iceberg.spark.driver_conf`: `-XX:SharedArchiveFile` when the archive is there). A
`cdclake` command then starts its Spark session and runs its first queries in about half the
time (docs/performance.md).

    python infra/class_archive.py        # (re)writes .cache/jars/cdclake-classes.jsa when stale

The archive is stale when a jar, PySpark's jars, the JVM (`JAVA_HOME`'s, else the `java` on
the path, as Spark's launcher picks it) or the code that sets the driver's class path changed
after it. The JVM checks it again itself: one it refuses only costs the sharing. Set-up goes on
without an archive when writing one fails (fetch-jars.sh).
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iceberg.spark import CLASS_ARCHIVE, DEFAULT_JARS_DIR, JAVA_OPTIONS  # noqa: E402

TIMEOUT_S = 600


def _java_home() -> Path | None:
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    java = shutil.which("java")
    return Path(java).resolve().parents[1] if java else None


def _changed(path: Path) -> float:
    """When `path` last changed: a package manager keeps a file's modification time, not its
    change time."""
    st = path.stat()
    return max(st.st_mtime, st.st_ctime)


def _inputs() -> list[Path]:
    import pyspark

    jars = [*DEFAULT_JARS_DIR.glob("*.jar"), *(Path(pyspark.__file__).parent / "jars").glob("*.jar")]
    code = [ROOT / "iceberg" / "spark.py", Path(__file__).resolve()]  # the driver's class path and options
    home = _java_home()
    jvm = [p for p in (home / "release", home / "lib" / "server" / "libjvm.so") if p.exists()] if home else []
    return jars + code + jvm


def stale(target: Path) -> bool:
    return not target.exists() or any(_changed(p) > target.stat().st_mtime for p in _inputs())


def write(target: Path) -> None:
    """Runs the demo in a driver JVM that writes the classes it loaded to `target` as it exits."""
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        with tempfile.TemporaryDirectory() as work:
            options = f"{JAVA_OPTIONS} -XX:ArchiveClassesAtExit={shlex.quote(str(partial))}"
            env = {**os.environ, "CDCLAKE_SPARK__CONF": json.dumps({"spark.driver.extraJavaOptions": options})}
            code = (
                "import sys; from pathlib import Path; from pyspark.sql import SparkSession\n"
                "from connector.demo import demo; from iceberg import compat_spark\n"
                "demo(Path(sys.argv[1]))\n"
                "compat_spark.stop_jvm(SparkSession.builder.getOrCreate(), timeout=120)"  # written as the JVM exits
            )
            done = subprocess.run(
                [sys.executable, "-c", code, str(Path(work) / "demo")],
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
        if done.returncode or not partial.exists():
            sys.stderr.write(done.stdout + done.stderr)
            raise SystemExit(f"the demo's driver JVM wrote no class archive at {partial} (its output above)")
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)


def main() -> None:
    target = DEFAULT_JARS_DIR / CLASS_ARCHIVE
    with open(DEFAULT_JARS_DIR / ".class-archive.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another set-up writing it: its archive, if fresh, is ours
        if stale(target):
            print(f"writing the driver JVM's class archive {target} (a run of the demo)", file=sys.stderr)
            write(target)


if __name__ == "__main__":
    main()

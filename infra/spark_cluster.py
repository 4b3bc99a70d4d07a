#!/usr/bin/env python3
"""A Spark standalone cluster on 127.0.0.1 from the installed PySpark: one master, N workers.

    python infra/spark_cluster.py start DIR [--workers 2] [--cores 1] [--memory 2g]   # prints the master URL
    python infra/spark_cluster.py stop DIR

Ports are free loopback ports picked at start; the processes' pids are kept in DIR/pids, and
their logs in DIR/*.log. Point the connector at it with `[spark] master = "spark://..."`
(or `CDCLAKE_SPARK__MASTER`); run its drivers with SPARK_LOCAL_IP=127.0.0.1 so executors
reach them on the loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class SparkCluster:
    def __init__(self, workdir: str | Path):
        self.dir = Path(workdir).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.master_url = ""

    def _spawn(self, name: str, *args: str) -> int:
        env = {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        }
        log = open(self.dir / f"{name}.log", "ab")
        proc = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        with open(self.dir / "pids", "a") as f:
            f.write(f"{proc.pid}\n")
        return proc.pid

    def start(self, workers: int = 2, cores: int = 1, memory: str = "2g", timeout: float = 90.0) -> SparkCluster:
        port, ui = _free_port(), _free_port()
        self._spawn(
            "master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
            "--webui-port", str(ui),
        )  # fmt: skip
        self.master_url = f"spark://127.0.0.1:{port}"
        for i in range(workers):
            work = self.dir / f"worker-{i}"
            work.mkdir(exist_ok=True)
            self._spawn(
                f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--cores", str(cores), "--memory", memory, "--webui-port", str(_free_port()),
                "--work-dir", str(work), self.master_url,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                    if json.load(r).get("aliveworkers", 0) >= workers:
                        (self.dir / "master").write_text(self.master_url)
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"the Spark cluster did not come up with {workers} workers; see {self.dir}/*.log")

    def stop(self) -> None:
        pids = self.dir / "pids"
        if not pids.exists():
            return
        for pid in pids.read_text().split():
            try:
                os.killpg(int(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass
        pids.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("dir")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--memory", default="2g")
    args = parser.parse_args()
    cluster = SparkCluster(args.dir)
    if args.action == "start":
        print(cluster.start(args.workers, args.cores, args.memory).master_url)
    else:
        cluster.stop()


if __name__ == "__main__":
    main()

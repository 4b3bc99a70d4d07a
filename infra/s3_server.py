#!/usr/bin/env python3
"""S3 on 127.0.0.1: moto's server (`moto[server]`), for a warehouse on object storage.

    python infra/s3_server.py start DIR [--bucket lake]   # prints the catalog's settings
    python infra/s3_server.py stop DIR

The port is a free loopback port picked at first start and kept in DIR/port; the server's
pid is in DIR/pid. moto keeps its objects in memory: they live as long as the server.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ACCESS_KEY, SECRET_KEY, REGION = "testing", "testing", "us-east-1"  # moto takes any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self, workdir: str | Path):
        self.dir = Path(workdir).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        port_file = self.dir / "port"
        if not port_file.exists():
            port_file.write_text(str(_free_port()))
        self.port = int(port_file.read_text())
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def properties(self) -> dict[str, str]:
        """FileIO properties for pyiceberg (`s3.*`) and Iceberg's S3FileIO in Spark (the same
        keys, plus `client.region` and path-style access)."""
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.region": REGION,
            "client.region": REGION,
            "s3.path-style-access": "true",
        }

    def start(self, buckets: tuple[str, ...] = ("lake",), timeout: float = 30.0) -> S3Server:
        exe = Path(sys.executable).with_name("moto_server")
        log = open(self.dir / "server.log", "ab")
        self.proc = subprocess.Popen(
            [str(exe), "-H", "127.0.0.1", "-p", str(self.port)], stdout=log, stderr=log, start_new_session=True
        )
        (self.dir / "pid").write_text(str(self.proc.pid))
        deadline = time.monotonic() + timeout
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto's S3 server did not start on {self.endpoint}; see {self.dir / 'server.log'}")
            time.sleep(0.1)
        import boto3

        s3 = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )
        for bucket in buckets:
            s3.create_bucket(Bucket=bucket)
        return self

    def stop(self) -> None:
        pid_file = self.dir / "pid"
        if not pid_file.exists():
            return
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGTERM)
        except ProcessLookupError:
            pass
        if self.proc is not None:
            self.proc.wait(10)
        pid_file.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("dir")
    parser.add_argument("--bucket", default="lake")
    args = parser.parse_args()
    server = S3Server(args.dir)
    if args.action == "stop":
        server.stop()
        return
    server.start((args.bucket,))
    print(f'[catalog]\nwarehouse = "s3://{args.bucket}/warehouse"\n[catalog.properties]')
    for k, v in server.properties().items():
        print(f'"{k}" = "{v}"')


if __name__ == "__main__":
    main()

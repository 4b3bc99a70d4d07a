#!/usr/bin/env python3
"""An Iceberg REST catalog on 127.0.0.1: Iceberg's own `RESTCatalogServer` (the test
fixtures of iceberg-open-api) with a JDBC catalog on SQLite behind it, from the jars of
infra/rest-catalog/pom.xml (resolved with Maven into .cache/rest-catalog). Its own main
binds every interface, so a small launcher of ours (infra/rest-catalog/*.java, compiled
there once) binds the loopback only.

    python infra/rest_catalog.py start DIR   # prints the catalog's settings
    python infra/rest_catalog.py stop DIR

The port is a free loopback port picked at first start and kept in DIR/port; the catalog's
database and warehouse live in DIR.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOME = ROOT / ".cache" / "rest-catalog"
SOURCE = ROOT / "infra" / "rest-catalog"
SETTINGS = ROOT / "infra" / "maven-settings.xml"
MAIN = "org.apache.iceberg.rest.LoopbackRESTCatalogServer"


def fetch() -> str:
    """The server's classpath: the resolved jars and the compiled launcher."""
    jars, classes = HOME / "jars", HOME / "classes"
    stamp = HOME / ".stamp"
    newest = max(p.stat().st_mtime for p in SOURCE.iterdir())
    if not stamp.exists() or stamp.stat().st_mtime < newest:
        jars.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mvn", "-q", "-B", "-s", str(SETTINGS), "-f", str(SOURCE / "pom.xml"), "dependency:copy-dependencies",
             f"-DoutputDirectory={jars}", "-DincludeScope=runtime"],
            check=True,
        )  # fmt: skip
        classes.mkdir(parents=True, exist_ok=True)
        subprocess.run(["javac", "-cp", f"{jars}/*", "-d", str(classes), *map(str, SOURCE.glob("*.java"))], check=True)
        stamp.touch()
    return f"{jars}/*{os.pathsep}{classes}"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RestCatalogServer:
    def __init__(self, workdir: str | Path):
        self.dir = Path(workdir).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        port_file = self.dir / "port"
        if not port_file.exists():
            port_file.write_text(str(_free_port()))
        self.port = int(port_file.read_text())
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def warehouse(self) -> str:
        return (self.dir / "warehouse").as_uri()

    def start(self, timeout: float = 60.0, bearer: str | None = None) -> RestCatalogServer:
        """`bearer`: the token every request but a token request must carry (else 401)."""
        classpath = fetch()
        log = open(self.dir / "server.log", "ab")
        backend = [f"uri=jdbc:sqlite:{self.dir / 'catalog.db'}", f"warehouse={self.warehouse}"]
        backend += [f"require-bearer={bearer}"] if bearer else []
        self.proc = subprocess.Popen(
            ["java", "-Xmx512m", "-cp", classpath, MAIN, "127.0.0.1", str(self.port), *backend],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        (self.dir / "pid").write_text(str(self.proc.pid))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log_file = self.dir / "server.log"
                raise RuntimeError(f"the REST catalog exited with {self.proc.returncode}; see {log_file}")
            try:
                with urllib.request.urlopen(f"{self.uri}/v1/config", timeout=2):
                    return self
            except urllib.error.HTTPError:  # it answers (401 where it requires a token)
                return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"the REST catalog did not answer on {self.uri} within {timeout}s")

    def stop(self) -> None:
        pid = self.proc.pid if self.proc else int((self.dir / "pid").read_text())
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        if self.proc:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(pid, signal.SIGKILL)
                self.proc.wait(10)
            self.proc = None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["start", "stop", "fetch"])
    ap.add_argument("dir", nargs="?", default=str(HOME / "server"))
    a = ap.parse_args()
    if a.action == "fetch":
        print(fetch())
        return
    server = RestCatalogServer(a.dir)
    if a.action == "start":
        server.start()
        print(f'[catalog]\ntype = "rest"\nuri = "{server.uri}"\nwarehouse = "{server.warehouse}"')
    else:
        server.stop()


if __name__ == "__main__":
    main()

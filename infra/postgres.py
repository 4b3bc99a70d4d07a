#!/usr/bin/env python3
"""One PostgreSQL server (Debian's `postgresql` package) on 127.0.0.1, for the JDBC catalog.

    python infra/postgres.py start DIR [--password SECRET]   # prints the catalog's settings
    python infra/postgres.py stop DIR

The cluster lives in DIR/data (made with `initdb` at first start, password authentication
on loopback only); the port is a free loopback port picked at first start and kept in
DIR/port, so a stopped server restarts on the same address. It holds one database,
`cdclake`, owned by the user `cdclake`. PostgreSQL refuses to run as root: as root, the
server runs as the `postgres` user of the Debian package.
"""

from __future__ import annotations

import argparse
import glob
import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

USER = DATABASE = "cdclake"


def binaries() -> Path:
    """The directory of `initdb` and `pg_ctl` (Debian keeps them out of PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise FileNotFoundError("no PostgreSQL server: install it with `apt-get install -y postgresql`")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, workdir: str | Path, password: str = "cdclake-test"):
        self.dir = Path(workdir).resolve()
        self.data = self.dir / "data"
        self.password = password
        self.bin = binaries()
        self.as_postgres = os.geteuid() == 0
        port_file = self.dir / "port"
        if not port_file.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            port_file.write_text(str(_free_port()))
        self.port = int(port_file.read_text())

    @property
    def uri(self) -> str:
        """The catalog's SQLAlchemy URI (without the password: `catalog.password` carries it)."""
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    def _run(self, *args: str, **kw) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self.as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)

    def _init(self) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        if self.as_postgres:
            pg = pwd.getpwnam("postgres")
            for p in (self.dir, self.data, pwfile):
                os.chown(p, pg.pw_uid, pg.pw_gid)
            # the server walks down to its data directory: each parent must let it through
            parent = self.dir.parent
            while parent != parent.parent:
                if not os.stat(parent).st_mode & 0o001:
                    os.chmod(parent, os.stat(parent).st_mode | 0o001)
                parent = parent.parent
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "--encoding=UTF8",
            "--no-sync",
        )
        pwfile.unlink()
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {self.port}\nunix_socket_directories = ''\n"
                "max_connections = 100\nfsync = off\n"
            )

    def start(self, timeout: float = 60.0) -> PostgresServer:
        first = not (self.data / "PG_VERSION").exists()
        if first:
            self._init()
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-w", "-t", str(int(timeout)), "start"
        )
        if first:
            import psycopg

            with psycopg.connect(
                host="127.0.0.1", port=self.port, user=USER, password=self.password, dbname="postgres", autocommit=True
            ) as conn:
                conn.execute(f"CREATE DATABASE {DATABASE}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.1)
        raise TimeoutError(f"PostgreSQL on 127.0.0.1:{self.port} did not start; see {self.data / 'server.log'}")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("dir")
    parser.add_argument("--password", default=os.environ.get("CDCLAKE_CATALOG__PASSWORD", "cdclake-test"))
    args = parser.parse_args()
    server = PostgresServer(args.dir, args.password)
    if args.action == "start":
        server.start()
        print(f"CDCLAKE_CATALOG__URI={server.uri}")
        print("CDCLAKE_CATALOG__PASSWORD=<the --password given>")
    else:
        server.stop()


if __name__ == "__main__":
    main()

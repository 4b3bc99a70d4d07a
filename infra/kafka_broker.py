#!/usr/bin/env python3
"""One Apache Kafka broker (KRaft, combined broker + controller) on 127.0.0.1, from the
jars of infra/kafka/pom.xml (resolved with Maven into .cache/kafka).

    python infra/kafka_broker.py start DIR [--sasl-password SECRET]   # prints the bootstrap servers
    python infra/kafka_broker.py stop DIR

Ports are free loopback ports picked at start and kept in DIR/ports.json, so a stopped
broker restarts on the same address. With --sasl-password a SASL_PLAINTEXT listener takes
user `$ConnectionString` (the Event Hubs Kafka endpoint's user name) with that password.
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
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JARS = ROOT / ".cache" / "kafka"
POM = ROOT / "infra" / "kafka" / "pom.xml"
SETTINGS = ROOT / "infra" / "maven-settings.xml"
SASL_USER = "$ConnectionString"


def fetch_jars() -> Path:
    stamp = JARS / ".stamp"
    if stamp.exists() and stamp.stat().st_mtime >= POM.stat().st_mtime:
        return JARS
    JARS.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "mvn",
            "-q",
            "-B",
            "-s",
            str(SETTINGS),
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={JARS}",
            "-DincludeScope=runtime",
        ],
        check=True,
    )
    stamp.touch()
    return JARS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"Kafka exited with {proc.returncode}; see its log")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"Kafka did not listen on 127.0.0.1:{port} within {timeout}s")


class KafkaBroker:
    def __init__(self, workdir: str | Path, sasl_password: str | None = None):
        self.dir = Path(workdir).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sasl_password = sasl_password
        ports_file = self.dir / "ports.json"
        if ports_file.exists():
            self.ports = json.loads(ports_file.read_text())
        else:
            self.ports = {"plain": free_port(), "controller": free_port(), "sasl": free_port()}
            ports_file.write_text(json.dumps(self.ports))
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.ports['plain']}"

    @property
    def sasl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.ports['sasl']}"

    def _properties(self) -> Path:
        p = self.ports
        listeners = [f"PLAINTEXT://127.0.0.1:{p['plain']}", f"CONTROLLER://127.0.0.1:{p['controller']}"]
        advertised = [f"PLAINTEXT://127.0.0.1:{p['plain']}"]
        lines = [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{p['controller']}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            f"log.dirs={self.dir / 'data'}",
            "num.partitions=1",
            "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        ]
        if self.sasl_password is not None:
            listeners.append(f"SASL_PLAINTEXT://127.0.0.1:{p['sasl']}")
            advertised.append(f"SASL_PLAINTEXT://127.0.0.1:{p['sasl']}")
            secret = self.sasl_password.replace("\\", "\\\\").replace('"', '\\"')
            lines += [
                "sasl.enabled.mechanisms=PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config="
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'user_{SASL_USER}="{secret}";',
            ]
        lines += ["listeners=" + ",".join(listeners), "advertised.listeners=" + ",".join(advertised)]
        path = self.dir / "server.properties"
        path.write_text("\n".join(lines) + "\n")
        return path

    def _java(self, main: str, *args: str) -> list[str]:
        return ["java", "-Xmx512m", "-cp", f"{fetch_jars()}/*", main, *args]

    def start(self, timeout: float = 60.0) -> KafkaBroker:
        props = self._properties()
        if not (self.dir / "data" / "meta.properties").exists():
            subprocess.run(
                self._java("kafka.tools.StorageTool", "format", "-t", uuid.uuid4().hex[:22], "-c", str(props)),
                check=True,
                capture_output=True,
            )
        log = open(self.dir / "broker.log", "ab")
        self.proc = subprocess.Popen(
            self._java("kafka.Kafka", str(props)), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        (self.dir / "broker.pid").write_text(str(self.proc.pid))
        _wait_port(self.ports["plain"], timeout, self.proc)
        return self

    def stop(self, kill: bool = False) -> None:
        pid = self.proc.pid if self.proc else int((self.dir / "broker.pid").read_text())
        try:
            os.killpg(pid, signal.SIGKILL if kill else signal.SIGTERM)
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
    ap.add_argument("dir", nargs="?", default=str(ROOT / ".cache" / "kafka-broker"))
    ap.add_argument("--sasl-password")
    a = ap.parse_args()
    if a.action == "fetch":
        print(fetch_jars())
        return
    broker = KafkaBroker(a.dir, a.sasl_password)
    if a.action == "start":
        broker.start()
        print(broker.bootstrap)
    else:
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())

"""A separate producer process for the end-to-end Kafka test: Debezium JSON events.

    python tests/kafka_producer.py BOOTSTRAP TOPIC N OUT.jsonl [GO_FILE]

Idempotent producer (acks=all), so a broker restart neither loses nor duplicates. Writes
every delivered event (partition, offset, key, op) to OUT.jsonl. With GO_FILE, produces
the first half, then waits (up to 5 minutes) for GO_FILE to exist before the second half.
"""

import json
import random
import sys
import time
from pathlib import Path

from confluent_kafka import Producer


def change(table: str, i: int, rng: random.Random) -> tuple[str, str, int, bool]:
    """Event `i` of the stream: its record key, value and partition, and whether a tombstone
    follows it (after a delete), as a Debezium PostgreSQL connector with 20 keys makes them."""
    key = rng.randrange(20)
    op = rng.choice(["c", "u", "u", "d"])
    after = None if op == "d" else {"id": key, "i": i}
    source = {"connector": "postgresql", "table": table, "lsn": 1000 + i}
    return json.dumps({"id": key}), json.dumps({"op": op, "after": after, "source": source}), key % 2, op == "d"


def main(bootstrap: str, topic: str, n: int, out: str, go_file: str | None = None) -> None:
    rng = random.Random(7)
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": 120000,
            "linger.ms": 5,
        }
    )
    delivered = open(out, "w")

    def on_delivery(err, msg):
        if err is not None:
            raise SystemExit(f"delivery failed: {err}")
        delivered.write(
            json.dumps(
                {
                    "partition": msg.partition(),
                    "offset": msg.offset(),
                    "key": msg.key().decode(),
                    "tombstone": msg.value() is None,
                }
            )
            + "\n"
        )

    table = topic.rsplit(".", 1)[1]
    for i in range(n):
        if go_file and i == n // 2:
            p.flush(120)
            deadline = time.monotonic() + 300
            while not Path(go_file).exists() and time.monotonic() < deadline:
                time.sleep(0.2)
        key, value, partition, tombstone = change(table, i, rng)
        p.produce(topic, key=key, value=value, partition=partition, on_delivery=on_delivery)
        if tombstone:
            p.produce(topic, key=key, value=None, partition=partition, on_delivery=on_delivery)
        p.poll(0)
        time.sleep(0.01)
    if p.flush(120) != 0:
        raise SystemExit("not every event was delivered")
    delivered.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)

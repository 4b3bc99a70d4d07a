"""A Debezium (PostgreSQL) stream of N events over K keys as kcat -J lines: the first
change of a key is a create, later ones mostly updates, about 10% deletes (each followed by
its tombstone); key k always goes to partition k % P."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

TOPIC = "bench.public.items"


def generate(
    path: Path,
    events: int,
    keys: int,
    partitions: int = 4,
    width: int = 100,
    seed: int = 1,
    lsn0: int = 1000,
    table: str = "items",
    mode: str = "w",
) -> int:
    """The stream into `path` (`mode` "a": after what it holds), topic `bench.public.<table>`."""
    # enqueued one millisecond apart, the last an hour ago: inside the log retention, as a live
    # stream is (a replay of an old dump would be trimmed at its first compaction)
    ts0 = int(time.time() * 1000) - 3_600_000 - events
    rng = random.Random(seed)
    alive: set[int] = set()
    offsets = [0] * partitions
    pad = "x" * width
    written = 0
    with path.open(mode) as f:
        lsn = lsn0
        while written < events:
            k = rng.randrange(keys)
            p = k % partitions
            lsn += 1
            if k in alive and rng.random() < 0.1:
                op, after = "d", None
                alive.discard(k)
            else:
                op = "u" if k in alive else "c"
                after = {"id": k, "v": lsn, "pad": pad}
                alive.add(k)
            value = json.dumps(
                {
                    "op": op,
                    "before": None,
                    "after": after,
                    "ts_ms": 1_700_000_000_000,
                    "source": {"connector": "postgresql", "table": table, "lsn": lsn},
                },
                separators=(",", ":"),
            )
            key = f'{{"id":{k}}}'
            for payload in [value, None] if op == "d" else [value]:
                f.write(
                    json.dumps(
                        {
                            "topic": f"bench.public.{table}",
                            "partition": p,
                            "offset": offsets[p],
                            "ts": ts0 + written,
                            "key": key,
                            "payload": payload,
                        }
                    )
                    + "\n"
                )
                offsets[p] += 1
                written += 1
    return written


def live_keys(path: Path) -> set[str]:
    """The model's answer: keys whose last event is not a delete (log order = lsn order here)."""
    last: dict[str, bool] = {}
    with path.open() as f:
        for line in f:
            r = json.loads(line)
            last[r["key"]] = r["payload"] is not None and '"op":"d"' not in r["payload"]
    return {k for k, alive in last.items() if alive}

"""The local checkpoints of compaction rounds, released when the rounds end."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

from iceberg import compat_spark


class _Rounds:
    """The rounds running in this process, and the RDDs persisted before the first began."""

    lock = threading.Lock()
    running = 0
    before: set[int] = set()


@contextmanager
def releasing_checkpoints(spark: SparkSession) -> Iterator[None]:
    """The local checkpoints made inside the block are released when it ends (else their
    blocks stay in Spark's block manager, spilling to disk, until the JVM's garbage
    collector happens to find their RDDs: round after round in a long `run --every`).
    Rounds that overlap in one process release theirs when the last of them ends; what
    other code persists in the same session while a round runs is released with them."""
    with _Rounds.lock:
        if not _Rounds.running:
            _Rounds.before = compat_spark.persisted_rdds(spark)
        _Rounds.running += 1
    try:
        yield
    finally:
        with _Rounds.lock:
            _Rounds.running -= 1
            if not _Rounds.running:
                compat_spark.unpersist_rdds(spark, keep=_Rounds.before)

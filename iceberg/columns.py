"""Columns built once per Spark context. A PySpark `Column` is a handle on an unresolved
expression in the driver's JVM, which a frame of any session of that context can use, and
building one costs a round trip to the JVM per function, name and alias (three for
`F.col(name)`), and one more when Python lets its handle go. A pass over many tables builds
the same columns for every table, so the builders that depend only on their arguments keep
what they built (docs/performance.md, "Columns built once per Spark context")."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import lru_cache, wraps
from typing import TypeVar
from weakref import WeakKeyDictionary

from pyspark import SparkContext

T = TypeVar("T")
KEPT = 256  # results kept per builder and context: a few per pass (its time, its tables' column sets)


def once_per_context(build: Callable[..., T]) -> Callable[..., T]:
    """`build(*args)` (hashable arguments), kept per Spark context: `build` runs again only for
    arguments not among the `KEPT` it was last given."""
    built: WeakKeyDictionary[SparkContext, Callable[..., T]] = WeakKeyDictionary()
    lock = threading.Lock()

    @wraps(build)
    def get(*args: object) -> T:
        context = SparkContext.getOrCreate()  # the running one: columns are built in its JVM
        with lock:
            cached = built.get(context)
            if cached is None:
                cached = built[context] = lru_cache(KEPT)(build)
        return cached(*args)

    return get

"""Crash points for the exactly-once tests.

`CDCLAKE_CRASH_AT=<name>[:<n>]` makes the process kill itself with SIGKILL the n-th time
(default first) it reaches the named point, the same as `kill -9` at that instant.
Unset in production: a no-op.
"""

import os
import signal
from collections import Counter

CRASH_ENV = "CDCLAKE_CRASH_AT"
_hits: Counter[str] = Counter()


def crash_point(name: str) -> None:
    target = os.environ.get(CRASH_ENV)
    if not target:
        return
    point, _, nth = target.partition(":")
    if point == name:
        _hits[name] += 1
        if _hits[name] == int(nth or 1):
            os.kill(os.getpid(), signal.SIGKILL)

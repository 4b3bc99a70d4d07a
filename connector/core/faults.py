"""Crash and failure points for the exactly-once tests.

`CDCLAKE_CRASH_AT=<name>[:<n>]` makes the process kill itself with SIGKILL the n-th time
(default first) it reaches the named point, the same as `kill -9` at that instant;
`CDCLAKE_FAIL_AT=<name>[:<n>]` raises `InjectedFailure` there instead (an I/O error, say).
Unset in production: no-ops.
"""

import os
import signal
from collections import Counter

CRASH_ENV = "CDCLAKE_CRASH_AT"
FAIL_ENV = "CDCLAKE_FAIL_AT"
_hits: Counter[tuple[str, str]] = Counter()


class InjectedFailure(OSError):
    """Raised at a failure point (`CDCLAKE_FAIL_AT`)."""


def _reached(env: str, name: str) -> bool:
    target = os.environ.get(env)
    if not target:
        return False
    point, _, nth = target.partition(":")
    if point != name:
        return False
    _hits[env, name] += 1
    return _hits[env, name] == int(nth or 1)


def crash_point(name: str) -> None:
    if _reached(CRASH_ENV, name):
        os.kill(os.getpid(), signal.SIGKILL)
    fail_point(name)


def fail_point(name: str) -> None:
    if _reached(FAIL_ENV, name):
        raise InjectedFailure(f"injected failure at {name}")

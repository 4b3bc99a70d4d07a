"""`cdclake run --every`: a job that stays up.

Rounds (ingest, then compaction) repeat every N seconds. A round that fails for a reason that
may pass (a broker or store away, another process holding a lease, a conflicting commit,
a full disk) is logged in one line, counted in `cdclake_round_failures_total`, and retried
after a backoff that doubles up to `MAX_BACKOFF_S`; one that cannot pass by waiting (the
configuration, a quota under policy `fail`) stops the job. SIGTERM (or SIGINT) lets the
round end where it is safe: ingest after the batch it is committing, compaction after its
round; the job then exits 0. `/ready` on the metrics port answers 200 while the last round
succeeded, 503 before the first and after a failure.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge, make_wsgi_app

from connector.core import failures
from connector.core.errors import ConfigError, ConnectorError, SetupError

log = logging.getLogger(__name__)
MIN_BACKOFF_S, MAX_BACKOFF_S = 1.0, 300.0
ROUND_FAILURES = Counter("cdclake_round_failures_total", "rounds that failed and will be retried", ["kind"])
READY = Gauge("cdclake_ready", "1 while the last round succeeded")


class Stopped(Exception):
    """Raised at a safe point (after a committed batch) once a stop was asked for."""


def permanent(e: BaseException) -> bool:
    """Whether waiting cannot mend the failure: the configuration, a quota under policy `fail`."""
    from quotas.errors import QuotaConfigError, QuotaExceededError

    return isinstance(e, ConfigError | SetupError | QuotaConfigError | QuotaExceededError)


def retryable(e: BaseException) -> bool:
    """A failure of the connector or of its environment that a later round may not meet."""
    return not permanent(e) and (isinstance(e, ConnectorError) or failures.describe(e) is not None)


def backoff(every: float, failed: int) -> float:
    """Seconds to wait after the `failed`-th failure in a row: `every` doubled, bounded."""
    return min(MAX_BACKOFF_S, max(every, MIN_BACKOFF_S) * 2.0 ** (failed - 1))


def serve(port: int, host: str, ready: threading.Event) -> None:
    """Prometheus metrics on every path but `/ready` (200 when ready, else 503)."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    metrics = make_wsgi_app()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") == "/ready":
            ok = ready.is_set()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ready\n" if ok else b"not ready\n"]
        return metrics(environ, start_response)

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

    server = make_server(host, port, app, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (a second one interrupts at once)."""
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        log.warning("%s: stopping after the current batch or round", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def run_forever(
    every: float,
    one_round: Callable[[], None],
    stop: threading.Event,
    ready: threading.Event,
    report: Callable[[str], None],
) -> None:
    """Runs `one_round` every `every` seconds until `stop`; failures as the module says.
    `report` prints a one-line notice."""
    failed = 0
    while not stop.is_set():
        try:
            one_round()
        except Stopped:
            break
        except Exception as e:
            if not retryable(e):
                raise
            failed += 1
            ready.clear()
            READY.set(0)
            ROUND_FAILURES.labels(type(e).__name__).inc()
            wait = backoff(every, failed)
            why = failures.describe(e) or str(e)
            report(f"round failed ({why}); retrying in {wait:g} s (failure {failed} in a row)")
            stop.wait(wait)
            continue
        failed = 0
        ready.set()
        READY.set(1)
        stop.wait(every)

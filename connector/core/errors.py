"""One error root for the product; every error says where it happened and what to do."""


class ConnectorError(Exception):
    """Root of every error the connector raises on purpose."""


class ConfigError(ConnectorError):
    """A configuration key is missing or invalid. The message names the key."""


class DecodeError(ConnectorError):
    """An input record cannot be decoded; it goes to the dead-letter table with `reason`."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class SetupError(ConnectorError):
    """The runtime is incomplete (for example Spark's JVM jars were never fetched)."""


class SourceError(ConnectorError):
    """A source cannot deliver records (unreadable file, broker unreachable, ...)."""


class ConcurrentWriterError(ConnectorError):
    """Another process committed to a table this one writes: this one stops, having
    committed nothing of the batch to that table."""

from __future__ import annotations

from connector.core.errors import ConnectorError


class QuotaConfigError(ConnectorError):
    """A table's settings do not fit its tier; the message names table, setting, tier, limit."""


class QuotaExceededError(ConnectorError):
    """A partition would exceed its tier's compacted size. Nothing of it was committed."""

    def __init__(self, refusals: list[Refusal]):  # noqa: F821 - defined in quotas.admit
        self.refusals = refusals
        super().__init__("; ".join(r.message() for r in refusals))

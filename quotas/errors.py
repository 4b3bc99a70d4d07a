from __future__ import annotations

from typing import TYPE_CHECKING

from connector.core.errors import ConnectorError

if TYPE_CHECKING:
    from quotas.admit import Refusal


class QuotaConfigError(ConnectorError):
    """A table's settings do not fit its tier; the message names table, setting, tier, limit."""


class QuotaExceededError(ConnectorError):
    """A partition would exceed its tier's compacted size. Nothing of it was committed."""

    def __init__(self, refusals: list[Refusal]):
        self.refusals = refusals
        super().__init__("; ".join(r.message() for r in refusals))

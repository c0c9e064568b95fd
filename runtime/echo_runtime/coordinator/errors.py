"""How the coordinator refuses a request: :class:`Rejected`, a 4xx naming the field at fault.

Every part of the coordinator's state raises it before its first mutation, so a refused request
changes nothing; the HTTP layer (:mod:`.api`) turns it into ``{"error": {"code", "field", "message"}}``.
"""

from __future__ import annotations


class Rejected(Exception):
    """A request the coordinator refuses; maps to a 4xx reply naming ``field``. Nothing was changed."""

    def __init__(self, status: int, code: str, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.status = status
        self.code = code
        self.field = field
        self.message = message

"""What a bad request gets: an HTTP status and one sentence naming the field and what was wanted."""

from __future__ import annotations


class BadRequest(Exception):
    """Refuse one request (and only it) with `status` and `message`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

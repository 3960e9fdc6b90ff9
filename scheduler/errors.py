"""The one error type a user can cause: bad input, named precisely.

Every file, flag or request a user hands the project that cannot be used raises `InputError`.
Its message is one sentence: where (file), what (field) and what was expected. The command line
prints it and exits with status 2; the server answers it with HTTP 400. Nothing else is caught.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: `source` (a file name or "request"), `field` (a JSON path) and `expected`."""

    def __init__(self, source: str, field: str, expected: str, got: object = None) -> None:
        self.source = source
        self.field = field
        self.expected = expected
        self.got = got
        where = f"{source}: {field}" if field else source
        tail = "" if got is None else f", got {_short(got)}"
        super().__init__(f"{where}: expected {expected}{tail}")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

"""Small checks for decoded JSON that raise `InputError` naming the file and the field."""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

from scheduler.errors import InputError

MAX_LATENCY_MS = 3_600_000.0  # one hour: the largest latency a profile or workload may hold
# A tebibyte per sample: more than any GPU's memory, let alone one feature map, holds; transfer
# times and memory sums stay finite (a cut of 10**400 bytes overflowed float)
MAX_SAMPLE_BYTES = 2**40
_HOUR_IN = {"s": MAX_LATENCY_MS / 1000.0, "ms": MAX_LATENCY_MS, "us": MAX_LATENCY_MS * 1000.0}


def read_json(path: str | Path, what: str) -> object:
    """Decode the JSON file at `path`; unreadable or invalid files raise `InputError`."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # tolerate a BOM
    except OSError as exc:
        raise InputError(source, "", f"a readable {what} JSON file", exc.strerror) from None
    except UnicodeDecodeError as exc:
        raise InputError(source, "", f"a {what} JSON file in UTF-8 ({exc.reason})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(source, "", f"valid JSON (line {exc.lineno}: {exc.msg})") from None


def is_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: object) -> TypeGuard[int | float]:
    return isinstance(x, int | float) and not isinstance(x, bool)


def json_object(x: object, source: str, field: str) -> Mapping[str, Any]:
    if not isinstance(x, dict):
        raise InputError(source, field or "(top level)", "a JSON object", type(x).__name__)
    return x


def known_keys(doc: Mapping[str, Any], keys: Sequence[str], source: str, where: str) -> None:
    """Refuse the first key of `doc` not in `keys`, naming it, the keys expected and the closest
    of them (a misspelt key would otherwise be ignored and its default silently used)."""
    for key in doc:
        if key not in keys:
            hint = did_you_mean(str(key), keys)
            field = f"{where}.{key}" if where else str(key)
            raise InputError(source, field, f"only the keys {', '.join(keys)} (unknown key{hint})")


def did_you_mean(name: str, choices: Sequence[str]) -> str:
    """ "; did you mean X?" for the choice closest to a misspelt `name`, or "" when none is."""
    close = difflib.get_close_matches(name, choices, n=1)
    return f"; did you mean {close[0]}?" if close else ""


def latency_at_most_an_hour(x: float, unit: str, source: str, field: str) -> None:
    """Refuse a measured latency `x`, counted in `unit` ("s", "ms" or "us"), above one hour
    (MAX_LATENCY_MS), naming the bound in that unit: sums and squares of latencies over a whole
    model or pipeline then stay far from float overflow (1e300 ms would not)."""
    bound = _HOUR_IN[unit]
    if x > bound:
        raise InputError(source, field, f"a latency of at most {bound:.0f} {unit} (one hour)", x)


def number_from(x: object, low: float, high: float, what: str, source: str, field: str) -> float:
    """`x` as a float if it is a JSON number in [low, high]; else InputError naming the field,
    e.g. "expected a price per machine-hour from 1e-09 to 1e+09" (`what` is "a price per
    machine-hour")."""
    if not is_number(x) or not low <= x <= high:
        raise InputError(source, field, f"{what} from {low:g} to {high:g}", x)
    return float(x)


def nonempty_str(x: object, source: str, field: str) -> str:
    if not isinstance(x, str) or not x:
        raise InputError(source, field, "a non-empty string", x)
    return x


def int_list(x: object, source: str, field: str, positive: bool) -> list[int]:
    if not isinstance(x, list) or not all(is_int(v) and (v > 0 or not positive) for v in x):
        raise InputError(source, field, "a list of positive integers", x)
    return list(x)

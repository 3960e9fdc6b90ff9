"""Loading shipped weights strictly, with one clear sentence naming the file when that fails."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


class Unusable(Exception):
    """Raised by a `pick` function: the file loaded but does not hold what was expected."""


def load_strict(
    model: M,
    path: str | os.PathLike[str],
    expected: str,
    pick: Callable[[Any], dict[str, Any]] | None = None,
) -> M:
    """`model` with the state dict in `path` loaded with `strict=True`, in eval mode, on CPU.

    The file is read with `torch.load(weights_only=True, map_location="cpu")`; `pick` turns what
    it holds into the state dict (default: it must be one). Raises FileNotFoundError if `path`
    does not exist, and ValueError("<path>: expected <expected>, could not load: <why>.") if it
    cannot be read or does not fit the model.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: weights file not found.")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
        state = pick(obj) if pick else _as_state_dict(obj)
        model.load_state_dict(state, strict=True)
    except Unusable as exc:
        raise ValueError(f"{path}: expected {expected}, could not load: {exc}.") from exc
    except Exception as exc:  # torch raises many types for a bad file; the user needs one
        raise ValueError(f"{path}: expected {expected}, could not load: {_reason(exc)}.") from exc
    return model.eval()


def _as_state_dict(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise Unusable(f"it holds a {type(obj).__name__}, not a dict")
    return obj


def _reason(exc: BaseException) -> str:
    """One line saying why loading failed, without torch's advice to drop `weights_only`."""
    text = str(exc)
    if "WeightsUnpickler error:" in text:
        detail = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation")[0]
        text = f"not a tensors-only torch pickle ({' '.join(detail.split())})"
    text = " ".join(text.split()).rstrip(".")
    if len(text) > 300:
        text = text[:297] + "..."
    return (
        f"{type(exc).__name__}: {text}" if text else f"{type(exc).__name__} (empty or truncated?)"
    )

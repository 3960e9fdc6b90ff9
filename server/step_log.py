"""A record of every step the server ran, one JSON line each (`layerbatch serve --step-log`).

A line reads, for example,

    {"t_ms": 8123.41, "lane": "step", "model": "mobilenet_v2", "first_stage": 7,
     "stages": 6, "batch": 9, "ms": 11.93, "cancelled": false}

`t_ms` is when the step started, in ms since the runtime started; `lane` is "step" (the
executor thread) or "stacked" (the second lane, `Plan.beside`); `stages` is how many stages
it ran from `first_stage` (fewer than planned when it was cancelled at a stage boundary, none
when before its first); `batch` is how many requests ran; `ms` is its own time, read on the
thread that ran it, as `/metrics` counts it (`layerbatch_busy_ms_total`). A server of several
replicas (`--replicas`) writes them all to one log, each line with its `replica` (0, 1, ...);
`t_ms` counts from when that replica started. Lines are written as
steps are settled, one write each, so a server that is killed loses none that it had settled.

`bench/step_replay.py` replays such a log on an otherwise idle machine, to tell what the steps
cost alone from what they cost while serving.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

from scheduler.errors import InputError


class StepLog:
    """Appends one line per step to `path` (created or truncated when opened)."""

    def __init__(self, path: Path) -> None:
        try:
            self._file: TextIO = path.open("w", buffering=1, encoding="utf-8")
        except OSError as exc:
            raise InputError(
                f"--step-log {path}", "", f"a file it can write ({exc.strerror})"
            ) from None
        self.path = path

    def write(
        self,
        lane: str,
        t_ms: float,
        model: str,
        first_stage: int,
        stages: int,
        batch: int,
        took_ms: float,
        cancelled: bool,
        replica: int | None = None,
    ) -> None:
        line: dict[str, object] = {
            "t_ms": round(t_ms, 3), "lane": lane, "model": model, "first_stage": first_stage,
            "stages": stages, "batch": batch, "ms": round(took_ms, 4), "cancelled": cancelled,
        }  # fmt: skip
        if replica is not None:
            line["replica"] = replica
        self._file.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self._file.close()

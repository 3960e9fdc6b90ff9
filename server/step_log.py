"""A record of every step the server ran, one JSON line each (`layerbatch serve --step-log`).

A line reads, for example,

    {"t_ms": 8123.41, "lane": "step", "model": "mobilenet_v2", "first_stage": 7,
     "stages": 6, "batch": 9, "ms": 11.93, "planned_ms": 12.4, "cancelled": false}

`t_ms` is when the step started, in ms since the runtime started; `lane` is "step" (the
executor thread) or "stacked" (the second lane, `Plan.beside`); `stages` is how many stages
it ran from `first_stage` (fewer than planned when it was cancelled at a stage boundary, none
when before its first); `batch` is how many requests ran; `ms` is its own time, read on the
thread that ran it, as `/metrics` counts it (`layerbatch_busy_ms_total`); `planned_ms` is what
the plan took those stages to cost (its calibrated profile at the planned batch, with the
decodes it charges to a first stage when they run on the executor thread).

A request a plan drops gets a line of its own when it is answered:

    {"t_ms": 8130.02, "drop": "r512", "app": "googlenet", "reason": "...",
     "waited_ms": 412.5, "left_ms": 587.5, "late_by_ms": 41.3}

`waited_ms` is how long it had been queued, `left_ms` how long was left to its deadline, and
`late_by_ms` how late the plan that dropped it predicted it would finish had it been kept
(null where it made no prediction: a deadline already passed). A request served gets one
when its answer is sent:

    {"t_ms": 8131.7, "answer": "r513", "app": "googlenet", "total_ms": 305.2, "left_ms": -5.2}

`total_ms` is its time in the server, from when its handler had read it, and `left_ms` how long
was left to its deadline then (negative: answered late by the server's own clock). A server of
several replicas (`--replicas`) writes them all to one log, each line with its `replica` (0, 1,
...); `t_ms` counts from when that replica started. Lines are written as steps are settled and
requests answered, one write each, so a server that is killed loses none that it had written.

`bench/step_replay.py` replays such a log on an otherwise idle machine, to tell what the steps
cost alone from what they cost while serving.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

from scheduler.errors import InputError


class StepLog:
    """Appends one line per step, one per dropped request and one per request served, to `path`
    (created or truncated when opened)."""

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
        planned_ms: float,
        cancelled: bool,
        replica: int | None = None,
    ) -> None:
        self._line({
            "t_ms": round(t_ms, 3), "lane": lane, "model": model, "first_stage": first_stage,
            "stages": stages, "batch": batch, "ms": round(took_ms, 4),
            "planned_ms": round(planned_ms, 4), "cancelled": cancelled,
        }, replica)  # fmt: skip

    def drop(
        self,
        t_ms: float,
        request_id: str,
        app: str,
        reason: str,
        waited_ms: float,
        left_ms: float,
        late_by_ms: float | None,
        replica: int | None = None,
    ) -> None:
        late = None if late_by_ms is None else round(late_by_ms, 3)
        self._line({
            "t_ms": round(t_ms, 3), "drop": request_id, "app": app, "reason": reason,
            "waited_ms": round(waited_ms, 3), "left_ms": round(left_ms, 3), "late_by_ms": late,
        }, replica)  # fmt: skip

    def answer(
        self,
        t_ms: float,
        request_id: str,
        app: str,
        total_ms: float,
        left_ms: float,
        replica: int | None = None,
    ) -> None:
        self._line({
            "t_ms": round(t_ms, 3), "answer": request_id, "app": app,
            "total_ms": round(total_ms, 3), "left_ms": round(left_ms, 3),
        }, replica)  # fmt: skip

    def _line(self, line: dict[str, object], replica: int | None) -> None:
        if replica is not None:
            line["replica"] = replica
        self._file.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self._file.close()

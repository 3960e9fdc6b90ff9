"""Replay a server's steps on this machine, alone and beside a stand-in for the server's other
work: how much of what its steps cost while serving is the steps themselves.

    .venv/bin/python -m layerbatch serve --apps mobilenet_v2 --step-log steps.jsonl   # + load
    .venv/bin/python bench/step_replay.py steps.jsonl [--beside 5:0.16,0:0.08] [--skip 200]

The log (`server.step_log`) holds every step the server ran: model, first stage, stages, batch
and its own time. The models are loaded as `layerbatch serve` loads them (`build_runtime`:
folded batch norms, channels-last, the allocator's settings, the warm-up) and each logged step
runs again through the executor on the thread that loaded them, with random inputs of the
step's shapes admitted for its batch. The steps go in chunks; each chunk runs twice in turn,
alone and beside `--beside`: processes that each keep one core busy a share of every 5 ms at a
nice level (by default what the server's event loop, at its nice level `LOOP_NICE`, and the
load generator took while a log was written, read from /proc/PID/task/*/stat: 13-18% of a core
and 8% at nice 0 for mobilenet_v2 at 95 req/s on 2 cores). Alone and beside alternate chunk by
chunk, so a machine whose speed drifts moves both alike. Prints, per model and in all, the
logged milliseconds and the ratios logged / alone (how much slower the steps ran while serving)
and beside / alone (how much of that the stand-in reproduces).

The first `--skip` lines (the warm-up load) are left out; only "step" lines (the executor
thread, not the stacked lane) and uncancelled steps are replayed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from layerexec.torch_thread import LOOP_NICE  # noqa: E402

BURN_PERIOD_S = 0.005


@dataclass(frozen=True)
class Step:
    """One logged step: what ran, its own time, and (for reading, not replay) when it started
    and what its plan priced it at (`server.step_log`)."""

    model: str
    first_stage: int
    stages: int
    batch: int
    ms: float
    t_ms: float = 0.0
    planned_ms: float = 0.0


def read_steps(path: Path) -> list[Step]:
    """The replayable steps of a step log ("step" lane, not cancelled, a stage and a request at
    least), in order; its lines of requests dropped or served are passed over. Raises SystemExit
    naming the line for a line that is not a step log's."""
    steps = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            d = json.loads(line)
            if "drop" in d or "answer" in d:
                continue
            step = Step(d["model"], int(d["first_stage"]), int(d["stages"]), int(d["batch"]),
                        float(d["ms"]), float(d["t_ms"]), float(d["planned_ms"]))  # fmt: skip
            lane, cancelled = d["lane"], bool(d["cancelled"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SystemExit(
                f"{path}:{n}: expected a step log line (layerbatch serve --step-log), "
                f"got {line[:60]!r} ({exc})"
            ) from None
        if lane == "step" and not cancelled and step.stages > 0 and step.batch > 0:
            steps.append(step)
    return steps


def parse_beside(text: str) -> list[tuple[int, float]]:
    """'10:0.14,0:0.07' -> [(10, 0.14), (0, 0.07)]: nice level and share of one core each."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            nice, share = part.split(":")
            item = (int(nice), float(share))
        except ValueError:
            raise SystemExit(
                f"--beside: expected NICE:SHARE[,...] e.g. 10:0.14, got {part!r}"
            ) from None
        if not (0 <= item[0] <= 19 and 0.0 < item[1] < 1.0):
            raise SystemExit(f"--beside: expected nice 0-19 and a share in (0, 1), got {part!r}")
        out.append(item)
    return out


def burn(nice: int, share: float) -> None:
    """Keep one core busy `share` of every BURN_PERIOD_S, at `nice`, until killed."""
    os.nice(nice)
    while True:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < BURN_PERIOD_S * share:
            pass
        time.sleep(BURN_PERIOD_S * (1.0 - share))


@contextmanager
def beside(burners: Sequence[tuple[int, float]]) -> Iterator[None]:
    procs = [subprocess.Popen([sys.executable, __file__, "--burn", f"{n}:{s}"]) for n, s in burners]
    try:
        time.sleep(0.1)  # started and burning
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


class Replayer:
    """The models as `layerbatch serve` loads them; `run` replays steps on their thread."""

    def __init__(self, models: Sequence[str]) -> None:
        from server.build import build_runtime
        from server.runtime import Runtime

        runtime = build_runtime(list(models), decode_threads=0)
        assert isinstance(runtime, Runtime)  # one replica: a Runtime, not Replicas
        self.runtime = runtime
        self._ids = 0

    def close(self) -> None:
        self.runtime.torch_thread.close()

    def run(self, steps: Sequence[Step]) -> list[float]:
        """Each step's time (ms), replayed on the thread that loaded the models."""
        return self.runtime.torch_thread.call(self._run, steps)

    def _run(self, steps: Sequence[Step]) -> list[float]:
        import torch

        from scheduler.types import Action

        ex = self.runtime.executor
        out = []
        for s in steps:
            shape = self.runtime.models[s.model].in_shapes[s.first_stage]
            x = torch.randn(s.batch, *shape)
            if x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            ids = tuple(f"r{self._ids + i}" for i in range(s.batch))
            self._ids += s.batch
            for rid, value in zip(ids, x.unbind(0), strict=True):
                ex.admit(rid, s.model, s.first_stage, value)
            action = Action(s.model, (s.first_stage, s.first_stage + s.stages), ids)
            t0 = time.perf_counter()
            ex.run(action)
            out.append((time.perf_counter() - t0) * 1000.0)
            ex.drop(ids)
        return out


def replay(
    steps: Sequence[Step], burners: Sequence[tuple[int, float]], chunk: int, rounds: int
) -> dict[str, dict[str, float]]:
    """Per model and "all": logged, alone and beside milliseconds summed over `rounds` passes."""
    rp = Replayer(sorted({s.model for s in steps}))
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    try:
        rp.run(steps[: min(len(steps), chunk)])  # warm
        chunks = [steps[i : i + chunk] for i in range(0, len(steps), chunk)]
        for r in range(rounds):
            for i, part in enumerate(chunks):
                alone_first = (i + r) % 2 == 0
                for mode in ("alone", "beside") if alone_first else ("beside", "alone"):
                    if mode == "alone":
                        times = rp.run(part)
                    else:
                        with beside(burners):
                            times = rp.run(part)
                    for s, ms in zip(part, times, strict=True):
                        for key in (s.model, "all"):
                            totals[key][mode] += ms
                            if mode == "alone":
                                totals[key]["logged"] += s.ms
            print(f"  round {r + 1}/{rounds}: {format_row('all', totals['all'])}", flush=True)
    finally:
        rp.close()
    return {k: dict(v) for k, v in totals.items()}


def format_row(name: str, t: dict[str, float]) -> str:
    alone = max(t.get("alone", 0.0), 1e-9)
    return (
        f"{name:<16} logged {t.get('logged', 0.0) / 1000:7.2f} s  alone {alone / 1000:7.2f} s  "
        f"beside {t.get('beside', 0.0) / 1000:7.2f} s  logged/alone "
        f"{t.get('logged', 0.0) / alone:5.2f}  beside/alone {t.get('beside', 0.0) / alone:5.2f}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", nargs="?", type=Path, help="a step log (layerbatch serve --step-log)")
    ap.add_argument(
        "--beside", default=f"{LOOP_NICE}:0.16,0:0.08", help="NICE:SHARE of a core, ..."
    )
    ap.add_argument("--skip", type=int, default=0, help="leave out the first N steps")
    ap.add_argument("--limit", type=int, default=None, help="replay at most N steps")
    ap.add_argument("--chunk", type=int, default=200, help="steps per alone/beside pair")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--burn", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.burn:
        nice, share = parse_beside(a.burn)[0]
        burn(nice, share)
        return
    if a.log is None:
        ap.error("give a step log (layerbatch serve --step-log FILE)")
    if not a.log.is_file():
        raise SystemExit(f"{a.log}: expected a step log file, found none")
    if a.chunk < 1 or a.rounds < 1 or a.skip < 0:
        raise SystemExit("--chunk and --rounds: expected at least 1; --skip: at least 0")
    burners = parse_beside(a.beside)
    steps = read_steps(a.log)[a.skip :][: a.limit]
    if not steps:
        raise SystemExit(f"{a.log}: no steps to replay after --skip {a.skip}")
    print(f"replaying {len(steps)} steps, {a.rounds} round(s), beside {burners}", flush=True)
    totals = replay(steps, burners, a.chunk, a.rounds)
    for name in sorted(totals, key=lambda k: (k == "all", k)):
        print(format_row(name, totals[name]))


if __name__ == "__main__":
    main()

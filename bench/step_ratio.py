"""How well the plans priced the steps a server ran, by batch size, from its step logs.

For each model and batch size: how many steps the executor thread ran (not cancelled, after
`--skip-s` of warm-up; `bench.step_replay.read_steps`), their summed time against their summed
planned time (the time-weighted ratio, what calibration aims at 1) and the median and p90 of each
step's own ratio. A plan that prices one batch size
well and another badly shows here, where one mean over every step hides it: session 84 read
1.08-1.16x at batch 1 and 0.94-0.95x at batch 8 from one factor per stage (peers-log.md).

A step's planned time includes the decodes the plan charges to its model's first stage when they
run on the executor thread (`server.step_log`), so steps from the first stage read low there; the
comparison between two logs of the same setup is what this is for.

    .venv/bin/python bench/step_ratio.py out/server-ab/*.steps.jsonl
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: the repository root, for `bench.step_replay`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.step_replay import Step, read_steps


def ratios_by_batch(steps: Iterable[Step]) -> dict[tuple[str, int], dict[str, float]]:
    """(model, batch) -> steps, their time-weighted ratio (sum ms / sum planned ms), and the
    median and p90 of each step's ratio; steps with no planned time are left out."""
    groups: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for step in steps:
        if step.planned_ms > 0.0:
            groups[(step.model, step.batch)].append((step.ms, step.planned_ms))
    out = {}
    for key, pairs in sorted(groups.items()):
        ms, planned = np.array(pairs).T
        each = ms / planned
        out[key] = {
            "steps": len(pairs),
            "ratio": float(ms.sum() / planned.sum()),
            "p50": float(np.median(each)),
            "p90": float(np.quantile(each, 0.9)),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="+", type=Path, help="step logs (`serve --step-log`)")
    ap.add_argument("--skip-s", type=float, default=5.0, help="warm-up left out, per replica")
    args = ap.parse_args()
    for path in args.logs:
        steps = [s for s in read_steps(path) if s.t_ms >= 1000.0 * args.skip_s]
        print(f"{path}")
        print("  model          batch  steps  ms/planned  p50    p90")
        for (model, batch), r in ratios_by_batch(steps).items():
            print(
                f"  {model:<14} {batch:>5}  {r['steps']:>5.0f}  {r['ratio']:>10.3f}  "
                f"{r['p50']:.3f}  {r['p90']:.3f}"
            )


if __name__ == "__main__":
    main()

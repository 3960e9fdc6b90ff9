"""Wall time of a 5000-request simulation at 150 req/s (issue target: dp-time under 10 s).

Runs dp-time, dp-tardy and dynamic (a cheap planner, as the yardstick) on the same workload in
one process and prints each wall time and its ratio to dynamic's.

    .venv/bin/python bench/sim_speed.py [--profile NAME] [--requests 5000] [--rate 150]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from scheduler import Deployment, load_profile, make_policy
from sim.metrics import summarise
from sim.simulator import simulate
from sim.workload import make_workload

PROFILES = Path(__file__).resolve().parent.parent / "traces/data/profiles"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="googlenet-v3-pytorch-V100")
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--rate", type=float, default=150.0)
    args = ap.parse_args()
    p = load_profile(PROFILES / f"{args.profile}.json")
    d = Deployment([p])
    w = make_workload(
        d, args.rate, args.requests, "poisson", {p.model: 1.0}, 150.0, np.random.default_rng(1)
    )
    wall: dict[str, float] = {}
    for name in ("dynamic", "dp-time", "dp-tardy"):
        t0 = time.perf_counter()
        s = summarise(simulate(d, make_policy(name), w))
        wall[name] = time.perf_counter() - t0
        print(
            f"{name:<9} {wall[name]:6.2f} s  ({wall[name] / wall['dynamic']:.1f}x dynamic)  "
            f"on-time {s['on_time_ratio']:.3f}  mean batch {s['mean_batch']}"
        )
    verdict = "meets" if wall["dp-time"] < 10 else "MISSES"
    print(
        f"dp-time, {args.requests} requests at {args.rate:g} req/s: {wall['dp-time']:.2f} s ({verdict} the 10 s target)"
    )


if __name__ == "__main__":
    main()

"""Planning time of dp-time (paper 003, section 4.1: "scheduling 500 requests takes less than 2 ms").

For 50, 200 and 500 active requests of one model (a shipped GPU profile, B = 32): plan time of
  - the default grouped DP (G = 5), planned from scratch (empty memo),
  - the same after an incremental change (the first step executed, or one arrival), memo kept,
  - the exact per-request O(R^2) form, from scratch,
measured side by side in one run; printed as p50 / p99 and as ratios (machines here are noisy:
read the ratios). Target on a 2-core machine: grouped p99 <= 2 ms at 500 requests, incremental
cheaper than a full re-plan.

    .venv/bin/python bench/scheduler_overhead.py [--reps 200]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np

from scheduler import Deployment, Request, SchedulerState, load_profile, make_policy

PROFILE = (
    Path(__file__).resolve().parent.parent / "traces/data/profiles/googlenet-v3-pytorch-V100.json"
)


def queue_state(d: Deployment, n: int, rng: np.random.Generator) -> list[Request]:
    """n requests of a busy server: arrivals 2 ms apart on average, older ones further along."""
    model = next(iter(d.profiles))
    stages = d.profiles[model].num_stages
    arrivals = np.sort(-rng.exponential(2.0, n).cumsum())
    positions = np.sort(rng.integers(0, stages, n))[::-1]  # oldest first -> furthest along
    # about half the queue has not started yet
    positions[n // 2 :] = 0
    return [
        Request(f"r{i}", model, int(p), float(a), float("inf"))
        for i, (a, p) in enumerate(zip(arrivals, positions, strict=True))
    ]


def timed_us(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    d = Deployment([load_profile(PROFILE)], max_batch=32)
    grouped = make_policy("dp-time")
    exact = make_policy("dp-time", exact=True)
    rng = np.random.default_rng(1)
    print(f"dp-time planning time, {PROFILE.stem}, B=32, G=5, {args.reps} repetitions (us)")
    print(
        f"{'requests':>8} {'full p50':>9} {'full p99':>9} {'incr p50':>9} {'incr p99':>9} "
        f"{'exact p50':>10} {'exact p99':>10} {'incr/full':>9} {'exact/full':>10}"
    )
    for n in (50, 200, 500):
        reqs = queue_state(d, n, rng)
        full, incr, ex = [], [], []
        for rep in range(args.reps):
            # from scratch: a fresh state has an empty memo
            fresh = SchedulerState(d, reqs)
            full.append(timed_us(lambda: grouped.plan(fresh, 0.0)))  # noqa: B023
            # incremental: plan, change one thing, plan again on the same state
            live = SchedulerState(d, reqs)
            plan = grouped.plan(live, 0.0)
            if rep % 2 == 0:
                first = plan.actions[0]
                k1 = min(first.stages[1], d.group_end(first.model, first.stages[0]))
                act = dataclasses.replace(first, stages=(first.stages[0], k1))
                live.advance(act, k1 - first.stages[0])
            else:
                live.add(Request(f"new{rep}", reqs[0].app, 0, 0.0, float("inf")))
            incr.append(timed_us(lambda: grouped.plan(live, 0.0)))  # noqa: B023
            if rep < max(5, args.reps // 10):
                fresh2 = SchedulerState(d, reqs)
                ex.append(timed_us(lambda: exact.plan(fresh2, 0.0)))  # noqa: B023
        f50, f99 = np.percentile(full, [50, 99])
        i50, i99 = np.percentile(incr, [50, 99])
        e50, e99 = np.percentile(ex, [50, 99])
        print(
            f"{n:>8} {f50:>9.0f} {f99:>9.0f} {i50:>9.0f} {i99:>9.0f} {e50:>10.0f} {e99:>10.0f} "
            f"{i50 / f50:>9.2f} {e50 / f50:>10.1f}"
        )


if __name__ == "__main__":
    main()

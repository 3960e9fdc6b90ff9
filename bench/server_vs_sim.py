"""The real server against the simulator on the same Poisson trace (issue 4 target: on-time ratio
within 5 percentage points, mean completion within 15%).

One run: `layerbatch serve` in a child process on loopback, driven by the built-in load generator
(real video frames as JPEG) at Poisson arrivals; then the simulator replays exactly those arrivals
(times and apps) with the same policy, deadline and profiles, rescaled by the factor the server
measured between its steps' real and profiled times (`time_scale`, the profiles it plans with).
Prints both sides and the differences.

    .venv/bin/python bench/server_vs_sim.py [--policy dp-tardy] [--rate 25] [--duration 30]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import aiohttp
import numpy as np

from client.demo import DEMO_APPS, free_port, start_server, wait_ready
from client.frames import jpeg, video_frames
from client.loadgen import run_load, summary
from scheduler import Deployment, load_profile, make_policy
from scheduler.profile import scaled
from server.build import BUNDLED_PROFILES, profile_path
from sim.metrics import summarise
from sim.simulator import simulate
from sim.workload import Workload


async def drive(
    url: str, rate: float, duration: float, deadline: float, seed: int
) -> tuple[list, float]:  # type: ignore[type-arg]
    frames = [jpeg(f) for f in video_frames(limit=40, every=10)]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        await run_load(
            url, DEMO_APPS, frames, rate, 3.0, deadline, np.random.default_rng(seed + 1), s
        )
        records = await run_load(
            url, DEMO_APPS, frames, rate, duration, deadline, np.random.default_rng(seed), s
        )
        async with s.get(f"{url}/v1/status", headers={"Accept": "application/json"}) as r:
            scale = float((await r.json())["time_scale"])
    return records, scale


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="dp-tardy")
    ap.add_argument("--rate", type=float, default=25.0)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--deadline-ms", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(port, args.policy)
    try:
        asyncio.run(wait_ready(url, proc))
        records, scale = asyncio.run(
            drive(url, args.rate, args.duration, args.deadline_ms, args.seed)
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    real = summary(records, args.duration)
    profiles = [scaled(load_profile(profile_path(BUNDLED_PROFILES, m)), scale) for m in DEMO_APPS]
    d = Deployment(profiles)
    w = Workload(
        tuple(r.due_s * 1000.0 for r in records),
        tuple(r.app for r in records),
        args.deadline_ms,
        args.rate,
    )
    simulated = summarise(simulate(d, make_policy(args.policy), w))
    print(
        f"{args.policy}, {len(records)} requests at {args.rate:g} req/s, deadline {args.deadline_ms:g} ms; "
        f"profiles x{scale:.2f} (the server's measured time_scale)"
    )
    print(f"{'':<10} {'on-time':>8} {'mean ms':>9}")
    print(f"{'server':<10} {real['on_time_ratio']:>8.3f} {real['mean_ms']:>9.1f}")
    print(f"{'simulator':<10} {simulated['on_time_ratio']:>8.3f} {simulated['mean_ms']:>9.1f}")
    dpp = 100 * (real["on_time_ratio"] - simulated["on_time_ratio"])
    dmean = real["mean_ms"] / simulated["mean_ms"] - 1 if simulated["mean_ms"] else float("nan")
    ok = abs(dpp) <= 5 and abs(dmean) <= 0.15
    print(
        f"difference: on-time {dpp:+.1f} points, mean {100 * dmean:+.1f}% -> "
        f"{'within' if ok else 'OUTSIDE'} the targets (5 points, 15%)"
    )
    sys.exit(0)


if __name__ == "__main__":
    main()

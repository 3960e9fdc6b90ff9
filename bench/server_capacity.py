"""Capacity of each policy on the real server on this machine: the highest rate whose on-time
ratio (client-measured) is >= 0.9, with ratios to dynamic and nobatch.

Each (policy, rate) is one run of `--duration` seconds against one server process (the policy
switched with PUT /v1/policy), with the built-in load generator sending real video frames.

    .venv/bin/python bench/server_capacity.py [--rates 10,20,30,40,50] [--duration 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from pathlib import Path

import aiohttp
import numpy as np

from client.demo import DEMO_APPS, free_port, start_server, wait_ready
from client.frames import jpeg, video_frames
from client.loadgen import run_load, summary

POLICIES = ("dp-tardy", "dp-time", "dynamic", "nobatch")


async def sweep(
    url: str, rates: list[float], duration: float, deadline: float
) -> dict[str, dict[float, dict]]:  # type: ignore[type-arg]
    frames = [jpeg(f) for f in video_frames(limit=40, every=10)]
    out: dict[str, dict[float, dict]] = {}  # type: ignore[type-arg]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        for policy in POLICIES:
            async with s.put(f"{url}/v1/policy", json={"policy": policy}) as r:
                r.raise_for_status()
            out[policy] = {}
            for rate in rates:
                await run_load(
                    url, DEMO_APPS, frames, rate, 2.0, deadline, np.random.default_rng(7), s
                )
                recs = await run_load(
                    url, DEMO_APPS, frames, rate, duration, deadline, np.random.default_rng(1), s
                )
                out[policy][rate] = summary(recs, duration)
                print(
                    f"  {policy:<9} {rate:>5g} req/s: on-time {out[policy][rate]['on_time_ratio']:.3f}",
                    flush=True,
                )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="10,20,30,40,50")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--deadline-ms", type=float, default=300.0)
    ap.add_argument("--json", default="bench/results/server_capacity.json")
    args = ap.parse_args()
    rates = [float(x) for x in args.rates.split(",")]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(port, POLICIES[0])
    try:
        asyncio.run(wait_ready(url, proc))
        results = asyncio.run(sweep(url, rates, args.duration, args.deadline_ms))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    caps = {
        p: max((r for r, s in runs.items() if (s["on_time_ratio"] or 0) >= 0.9), default=None)
        for p, runs in results.items()
    }
    print(f"capacity on the real server ({', '.join(DEMO_APPS)}; deadline {args.deadline_ms:g} ms)")
    print(f"{'policy':<10} {'req/s':>6} {'x dynamic':>10} {'x nobatch':>10}")
    for p, c in caps.items():
        ratios = [
            f"{c / b:.2f}" if c and (b := caps.get(base)) else "-"
            for base in ("dynamic", "nobatch")
        ]
        print(f"{p:<10} {c if c is not None else '-':>6} {ratios[0]:>10} {ratios[1]:>10}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {
                "capacity_rps": caps,
                "runs": {p: {str(r): s for r, s in v.items()} for p, v in results.items()},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

"""The real server against the simulator on the same Poisson trace (issue 4 target: on-time ratio
within 5 percentage points, mean completion within 15%).

One run: `layerbatch serve` in a child process on loopback, driven by the built-in load generator
(real video frames as JPEG) at Poisson arrivals; then the simulator replays exactly those arrivals
(times and apps) with the same policy, deadline and the profiles the server plans with: each stage
rescaled by the factor it measured between its steps' real and profiled times (`stage_scales`), and
its measured decode time (`decode_ms`): as device time each admitted request costs before the next
step when it decodes on the executor thread (`simulate(decode_ms=...)`, the plans counting it in
each model's first stage as the server's do), else as a delay before a request reaches the
scheduler (the simulator's requests arrive that much later with that much less time to their
deadline, and it is added back to their completion times); and its measured hand-off between two
steps (`step_gap_ms`), which the simulated device waits after every step. Prints both sides, the
differences, and where the server's served requests spent their time (from the timings in its
answers). With `--replicas R` the server runs R runtimes and the simulator R devices, on the mean
of the replicas' calibrations.

    .venv/bin/python bench/server_vs_sim.py [--policy dp-tardy] [--rate 25] [--duration 30] \
        [--threads 2] [--replicas 2 --threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
from typing import Any

import aiohttp
import numpy as np

from client.demo import DEMO_APPS, free_port, start_server, wait_ready
from client.frames import jpeg, video_frames
from client.loadgen import Record, run_load, summary
from scheduler import Deployment, load_profile, make_policy
from scheduler.admission import ADMISSION_SHARE
from scheduler.profile import scaled_stages
from server.build import BUNDLED_PROFILES, profile_path
from sim.metrics import summarise
from sim.simulator import simulate
from sim.workload import Workload


async def drive(
    url: str, rate: float, duration: float, deadline: float, seed: int
) -> tuple[list[Record], dict[str, Any]]:
    frames = [jpeg(f) for f in video_frames(limit=40, every=10)]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        await run_load(
            url, DEMO_APPS, frames, rate, 3.0, deadline, np.random.default_rng(seed + 1), s
        )
        records = await run_load(
            url, DEMO_APPS, frames, rate, duration, deadline, np.random.default_rng(seed), s
        )
        async with s.get(f"{url}/v1/status", headers={"Accept": "application/json"}) as r:
            status = await r.json()
        async with s.get(f"{url}/metrics") as r:
            status["step_ratio_mean"] = step_ratio_mean(await r.text())
    return records, status


def step_ratio_mean(metrics: str) -> float | None:
    """Mean measured / planned time of the server's steps, from its /metrics text."""
    values = {}
    for line in metrics.splitlines():
        for part in ("sum", "count"):
            if line.startswith(f"layerbatch_step_time_ratio_{part}"):
                values[part] = float(line.split()[-1])
    return values["sum"] / values["count"] if values.get("count") else None


def calibration(status: dict[str, Any]) -> dict[str, Any]:
    """What the simulator takes from the server's /v1/status: its stage factors, decode time,
    hand-off between steps, time scale and door; with replicas, their mean over the replicas
    (the simulator runs one profile on every replica), and how many there are."""
    docs = status.get("replicas") or [status]

    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return sum(known) / len(known) if known else None

    scales = {
        m: [sum(d["stage_scales"][m][k] for d in docs) / len(docs) for k in range(len(fs))]
        for m, fs in docs[0]["stage_scales"].items()
    }
    return {
        "stage_scales": scales,
        "decode_ms": mean([d["decode_ms"] for d in docs]),
        "step_gap_ms": mean([d["step_gap_ms"] for d in docs]),
        "time_scale": mean([d["time_scale"] for d in docs]),
        "admission_share": docs[0]["admission_share"],
        "replicas": len(docs),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="dp-tardy")
    ap.add_argument("--rate", type=float, default=25.0)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--deadline-ms", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--threads",
        type=int,
        help="the server's torch threads (default: its own; all cores leaves none to decode "
        "beside, so it decodes on the executor thread)",
    )
    ap.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="the server's --replicas, simulated as that many devices (default 1)",
    )
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    extra = ["--replicas", str(args.replicas)]
    extra += [] if args.threads is None else ["--threads", str(args.threads)]
    proc = start_server(port, args.policy, extra)
    try:
        asyncio.run(wait_ready(url, proc))
        records, status = asyncio.run(
            drive(url, args.rate, args.duration, args.deadline_ms, args.seed)
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    real = summary(records, args.duration)
    cal = calibration(status)
    decode_ms = cal["decode_ms"] or 0.0
    on_device = status["decode_threads"] == 0
    profiles = [
        scaled_stages(load_profile(profile_path(BUNDLED_PROFILES, m)), cal["stage_scales"][m])
        for m in DEMO_APPS
    ]
    d = Deployment(profiles, groups=status["layer_groups"])  # the server's G per model
    delay_ms = 0.0 if on_device else decode_ms
    w = Workload(
        tuple(r.due_s * 1000.0 + delay_ms for r in records),
        tuple(r.app for r in records),
        args.deadline_ms - delay_ms,
        args.rate,
    )
    gap_ms = cal["step_gap_ms"] or 0.0
    # the server's door (None in its status: admission off), its share the server's default
    share = None if cal["admission_share"] is None else ADMISSION_SHARE
    simulated = summarise(
        simulate(
            d,
            make_policy(args.policy),
            w,
            step_gap_ms=gap_ms,
            admission_share=share,
            decode_ms=decode_ms if on_device else 0.0,
            replicas=cal["replicas"],
        )
    )
    simulated["mean_ms"] += delay_ms
    if simulated["queue_ms_mean"] is not None:
        simulated["queue_ms_mean"] += delay_ms  # the server's queue counts from reception
    print(
        f"{args.policy}, {len(records)} requests at {args.rate:g} req/s, deadline {args.deadline_ms:g} ms; "
        f"{cal['replicas']} replica(s), profiles x{cal['time_scale']:.2f} on average (the "
        "server's stage_scales), "
        f"decode {decode_ms:.1f} ms a sample ({'device time' if on_device else 'beside, a delay'}), "
        f"{gap_ms:.2f} ms between steps, admission "
        f"{'off' if share is None else f'within {share:.3g} of the deadline while overloaded'}"
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
    print(breakdown(records))
    print(
        f"simulator's time, mean ms: queue {simulated['queue_ms_mean']:.1f}, "
        f"in steps {simulated['in_steps_ms_mean']:.1f}, between steps "
        f"{simulated['mean_ms'] - simulated['queue_ms_mean'] - simulated['in_steps_ms_mean']:.1f}"
    )
    c = status["counters"]
    print(
        f"server: {c['preempted']} steps preempted, {c['stacked']} stacked; simulator: utilisation {simulated['utilisation']}"
    )
    ratio = status["step_ratio_mean"]
    if ratio is not None:
        print(f"the server's steps took {ratio:.2f}x their planned time on average")
    sys.exit(0)


def breakdown(records: list[Record]) -> str:
    """Means over served requests, from the server's answers: received -> first step (queue),
    inside steps (exec), the rest of the server's time (decode, waits between steps, hand-offs),
    and the client's time around the server (HTTP, its own loop)."""
    ok = [(r, r.server["timing"]) for r in records if r.status == "ok" and r.server is not None]
    if not ok:
        return "no request served"
    t = {
        k: statistics.mean(timing[k] for _, timing in ok)
        for k in ("queue_ms", "exec_ms", "total_ms")
    }
    client = statistics.mean(r.total_ms for r, _ in ok)
    rest = t["total_ms"] - t["queue_ms"] - t["exec_ms"]
    return (
        f"server's time, mean ms: queue {t['queue_ms']:.1f}, in steps {t['exec_ms']:.1f}, "
        f"decode and between steps {rest:.1f}; client around the server {client - t['total_ms']:.1f}"
    )


if __name__ == "__main__":
    main()

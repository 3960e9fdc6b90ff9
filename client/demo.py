"""`layerbatch demo`: the real server on this machine, driven by the built-in load generator.

Starts `layerbatch serve` (its default apps and bundled CPU profiles) in a child process, then at
each offered rate, for each policy in turn, switches the server to it (PUT /v1/policy) and sends
real video frames as JPEG at Poisson arrivals for `duration_s`; reports on-time ratio, mean and
p99 completion (measured by the client) and throughput per rate and policy, each policy's
capacity among the rates tried, and a PNG: on-time ratio against rate, and the completion-time
CDFs where the policies part.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from client.frames import jpeg, video_frames
from client.loadgen import Record, run_load, summary

DEMO_APPS = ("resnet18", "mobilenet_v2", "googlenet", "resnet20_cifar10", "ultraface_slim320")
# Offered loads, req/s. One fixed rate says nothing on a machine fast enough to serve it with every
# policy (on this 2-core machine the speed has doubled from one day to the next); a sweep up to
# five times its lowest rate shows where the policies part on a wide range of CPUs.
DEMO_RATES_RPS = (30.0, 60.0, 90.0, 120.0, 150.0)
ON_TIME_TARGET = 0.9  # a policy's capacity: the highest rate with at least this on-time ratio


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(port: int, policy: str, extra: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "layerbatch",
        "serve",
        "--port",
        str(port),
        "--policy",
        policy,
        *extra,
    ]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


async def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(
                    f"the server exited with status {proc.returncode}: {err.strip()[-500:]}"
                )
            try:
                async with s.get(f"{url}/readyz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError(f"the server at {url} was not ready within {timeout_s:g} s")


async def drive(
    url: str,
    policies: Sequence[str],
    rates_rps: Sequence[float],
    duration_s: float,
    deadline_ms: float,
    seed: int,
) -> dict[float, dict[str, list[Record]]]:
    """Each rate in turn, and at each rate every policy in turn on the same arrivals (switched
    on the one server, a 2 s warm-up at that rate after each switch): rate -> policy -> records.
    Interleaved so that a machine whose speed drifts compares the policies at one speed."""
    frames = [jpeg(f) for f in video_frames(limit=40, every=10)]
    out: dict[float, dict[str, list[Record]]] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        for i, rate in enumerate(rates_rps):
            out[rate] = {}
            for policy in policies:
                async with s.put(f"{url}/v1/policy", json={"policy": policy}) as r:
                    r.raise_for_status()
                warm = np.random.default_rng([seed, i, 1])
                await run_load(url, DEMO_APPS, frames, rate, 2.0, deadline_ms, warm, s)
                print(
                    f"  {rate:g} req/s, {policy}: {duration_s:g} s ...", file=sys.stderr, flush=True
                )
                arrivals = np.random.default_rng([seed, i])
                out[rate][policy] = await run_load(
                    url, DEMO_APPS, frames, rate, duration_s, deadline_ms, arrivals, s
                )
    return out


def run_demo(
    policies: Sequence[str] = ("dp-tardy", "dynamic", "nobatch"),
    rates_rps: Sequence[float] = DEMO_RATES_RPS,
    duration_s: float = 6.0,
    deadline_ms: float = 300.0,
    plot: str | Path | None = "out/demo-server.png",
    seed: int = 1,
) -> list[dict[str, Any]]:
    """One row per rate and policy (`rate_rps`, `policy` and `client.loadgen.summary`'s
    fields), rates ascending; draws `plot` if given."""
    rates = sorted(set(rates_rps))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(port, policies[0])
    try:
        asyncio.run(wait_ready(url, proc))
        records = asyncio.run(drive(url, policies, rates, duration_s, deadline_ms, seed))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    rows = [
        {"rate_rps": rate, "policy": p, **summary(recs, duration_s)}
        for rate, by_policy in records.items()
        for p, recs in by_policy.items()
    ]
    if plot:
        plot_demo(records, rows, deadline_ms, plot)
    return rows


def capacities(rows: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Per policy, the highest rate tried at which it served at least ON_TIME_TARGET of the
    requests on time (None: at no rate tried)."""
    out: dict[str, float | None] = {}
    for r in rows:
        best = out.setdefault(r["policy"], None)
        if (r["on_time_ratio"] or 0.0) >= ON_TIME_TARGET and (best is None or r["rate_rps"] > best):
            out[r["policy"]] = r["rate_rps"]
    return out


def parting_rate(rows: Sequence[dict[str, Any]]) -> float:
    """The rate whose completion times the plot shows: the highest at which some policy still
    served ON_TIME_TARGET on time (where the policies part), else the lowest tried."""
    ok = [r["rate_rps"] for r in rows if (r["on_time_ratio"] or 0.0) >= ON_TIME_TARGET]
    return float(max(ok) if ok else min(r["rate_rps"] for r in rows))


def plot_demo(
    records: dict[float, dict[str, list[Record]]],
    rows: Sequence[dict[str, Any]],
    deadline_ms: float,
    path: str | Path,
) -> None:
    """Left: on-time ratio against the offered rate, one line per policy. Right: the
    completion-time CDF of each policy at `parting_rate`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    for i, p in enumerate(policies):
        mine = sorted((r["rate_rps"], r["on_time_ratio"] or 0.0) for r in rows if r["policy"] == p)
        ax1.plot(*zip(*mine, strict=True), marker="o", color=f"C{i}", label=p)
    ax1.axhline(ON_TIME_TARGET, color="grey", linestyle=":", linewidth=1)
    ax1.set(
        xlabel="offered load (req/s, Poisson)",
        ylabel=f"on-time ratio (deadline {deadline_ms:g} ms)",
        ylim=(0, 1.02),
    )
    ax1.legend()
    ax1.grid(alpha=0.3)
    rate = parting_rate(rows)
    for i, p in enumerate(policies):
        recs = records[rate][p]
        ok = np.sort([r.total_ms for r in recs if r.status == "ok"])
        if ok.size:
            ax2.plot(ok, np.arange(1, ok.size + 1) / len(recs), color=f"C{i}", label=p)
    ax2.axvline(deadline_ms, color="grey", linestyle=":", linewidth=1)
    ax2.set(
        xlabel=f"completion time at {rate:g} req/s (ms, client-measured)",
        ylabel="share of requests finished",
        xscale="log",
        ylim=(0, 1.02),
    )
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.suptitle(f"layerbatch server, this CPU: {', '.join(DEMO_APPS)}")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows, then each policy's capacity among the rates tried."""
    head = (
        f"{'req/s':>6} {'policy':<10} {'on-time':>8} {'mean ms':>9} {'p99 ms':>9} "
        f"{'served/s':>9} {'dropped':>8} {'requests':>9}"
    )
    out = [head]
    for r in rows:
        out.append(
            f"{r['rate_rps']:>6g} {r['policy']:<10} {r['on_time_ratio'] or 0:>8.3f} "
            f"{r['mean_ms'] or 0:>9.1f} {r['p99_ms'] or 0:>9.1f} {r['throughput_rps']:>9.1f} "
            f"{r['dropped']:>8} {r['requests']:>9}"
        )
    out.append(f"\ncapacity (the highest rate tried with on-time >= {ON_TIME_TARGET:g}):")
    for p, cap in capacities(rows).items():
        out.append(
            f"  {p:<10} " + (f"{cap:g} req/s" if cap is not None else "under the lowest rate")
        )
    return "\n".join(out)


if __name__ == "__main__":
    print(json.dumps(run_demo(duration_s=float(sys.argv[1]) if len(sys.argv) > 1 else 6.0)))

"""`layerbatch demo`: the real server on this machine, driven by the built-in load generator.

Starts `layerbatch serve` (its default apps and bundled CPU profiles) in a child process, then for
each policy switches the server to it (PUT /v1/policy) and sends real video frames as JPEG at
Poisson arrivals for `duration_s`, and reports on-time ratio, mean and p99 completion (measured
by the client) and throughput, as a table and a PNG.
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
    rate_rps: float,
    duration_s: float,
    deadline_ms: float,
    seed: int,
) -> dict[str, list[Record]]:
    frames = [jpeg(f) for f in video_frames(limit=40, every=10)]
    out: dict[str, list[Record]] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        for policy in policies:
            async with s.put(f"{url}/v1/policy", json={"policy": policy}) as r:
                r.raise_for_status()
            await run_load(
                url,
                DEMO_APPS,
                frames,
                rate_rps,
                2.0,
                deadline_ms,
                np.random.default_rng(seed + 1),
                s,
            )  # warm-up
            print(
                f"  {policy}: {duration_s:g} s at {rate_rps:g} req/s ...",
                file=sys.stderr,
                flush=True,
            )
            out[policy] = await run_load(
                url,
                DEMO_APPS,
                frames,
                rate_rps,
                duration_s,
                deadline_ms,
                np.random.default_rng(seed),
                s,
            )
    return out


def run_demo(
    policies: Sequence[str] = ("dp-tardy", "dynamic", "nobatch"),
    rate_rps: float = 40.0,
    duration_s: float = 30.0,
    deadline_ms: float = 300.0,
    plot: str | Path | None = "out/demo-server.png",
    seed: int = 1,
) -> dict[str, dict[str, Any]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(port, policies[0])
    try:
        asyncio.run(wait_ready(url, proc))
        records = asyncio.run(drive(url, policies, rate_rps, duration_s, deadline_ms, seed))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    table = {p: summary(r, duration_s) for p, r in records.items()}
    if plot:
        plot_demo(records, table, deadline_ms, rate_rps, plot)
    return table


def plot_demo(
    records: dict[str, list[Record]],
    table: dict[str, dict[str, Any]],
    deadline_ms: float,
    rate_rps: float,
    path: str | Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for policy, recs in records.items():
        ok = np.sort([r.total_ms for r in recs if r.status == "ok"])
        if ok.size:
            served = ok.size / len(recs)
            ax1.plot(ok, np.arange(1, ok.size + 1) / ok.size * served, label=policy)
    ax1.axvline(deadline_ms, color="grey", linestyle=":", linewidth=1)
    ax1.set(
        xlabel="completion time (ms), client-measured",
        ylabel="share of requests finished",
        xscale="log",
    )
    ax1.legend()
    ax1.grid(alpha=0.3)
    names = list(table)
    ax2.bar(
        names,
        [table[p]["on_time_ratio"] or 0 for p in names],
        color=["C0", "C1", "C2", "C3", "C4", "C5", "C6"][: len(names)],
    )
    ax2.set(ylabel=f"on-time ratio (deadline {deadline_ms:g} ms)", ylim=(0, 1))
    fig.suptitle(f"layerbatch server, this CPU: {', '.join(DEMO_APPS)}; Poisson {rate_rps:g} req/s")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_table(table: dict[str, dict[str, Any]]) -> str:
    head = f"{'policy':<10} {'on-time':>8} {'mean ms':>9} {'p99 ms':>9} {'served/s':>9} {'dropped':>8} {'requests':>9}"
    rows = [head]
    for p, s in table.items():
        rows.append(
            f"{p:<10} {s['on_time_ratio']:>8.3f} {s['mean_ms'] or 0:>9.1f} {s['p99_ms'] or 0:>9.1f} "
            f"{s['throughput_rps']:>9.1f} {s['dropped']:>8} {s['requests']:>9}"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(json.dumps(run_demo(duration_s=float(sys.argv[1]) if len(sys.argv) > 1 else 30.0)))

"""Irina's workload (paper 002, section 4): average completion time of irina, tfs, dynamic and
dp-time, in the simulator on the shipped GPU profiles and on the real CPU server.

Regular queries (one detector-like model, a task of several samples) arrive at a fixed interval;
in each interval, with probability p, an ad-hoc query for one of three other models (chosen
uniformly) arrives at a uniformly random moment. Every sample of a query arrives at the query's
time; deadlines are the same for all. The paper reports irina's
speedup over the TF-Serving baseline (`tfs`) of 1.3x-2.5x across p; this prints ours beside it
and draws speedup against p (bench/results/irina.png).

Simulator: V100 profiles (PPipe's measurements): regular fcn-r101-cityscapes x16, ad-hoc
resnext152-32x4d x8, googlenet-v3-pytorch x8, repvgg-b3 x4. Those profiles carry no stacking
measurement, so a slowdown is assumed for every pair (--stack-slowdown, printed).
Server: `layerbatch serve` on this CPU with regular ultraface_slim320 x4 and ad-hoc resnet18 x2,
mobilenet_v2 x4, googlenet x2; the stacking slowdown of every pair is measured here first
(one torch thread per lane, as the server runs) and written into the profiles it serves.

    .venv/bin/python bench/irina.py [--queries 300] [--server-queries 60] [--no-server]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import numpy as np

from scheduler import Deployment, load_profile, make_policy
from scheduler.types import App
from sim.simulator import simulate
from sim.workload import Workload

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "traces/data/profiles"
POLICIES = ("irina", "tfs", "dynamic", "dp-time")
P_VALUES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
GPU_REGULAR = ("fcn-r101-cityscapes", 16)
GPU_ADHOC = (("resnext152-32x4d", 8), ("googlenet-v3-pytorch", 8), ("repvgg-b3", 4))
CPU_REGULAR = ("ultraface_slim320", 4)
CPU_ADHOC = (("resnet18", 2), ("mobilenet_v2", 4), ("googlenet", 2))


def queries(
    n: int, interval_ms: float, p: float, regular: tuple[str, int],
    adhoc: tuple[tuple[str, int], ...], rng: np.random.Generator,
) -> list[tuple[float, str, int]]:  # fmt: skip
    """(time, app, samples) of each query, in time order: n regular ones at a fixed interval,
    and in each interval an ad-hoc one with probability p (module docstring)."""
    out = []
    for i in range(n):
        out.append((i * interval_ms, *regular))
        if rng.random() < p:
            app, size = adhoc[int(rng.integers(len(adhoc)))]
            out.append(((i + float(rng.random())) * interval_ms, app, size))
    return sorted(out)


def as_workload(qs: list[tuple[float, str, int]], deadline_ms: float) -> Workload:
    times, apps = [], []
    for t, app, size in qs:
        times += [t] * size
        apps += [app] * size
    return Workload(tuple(times), tuple(apps), deadline_ms, 1.0)


def simulated(args: argparse.Namespace) -> dict[str, Any]:
    names = [GPU_REGULAR[0], *(m for m, _ in GPU_ADHOC)]
    profiles = []
    for m in names:
        profile = load_profile(PROFILES / f"{m}-V100.json")
        others = {o: args.stack_slowdown for o in names if o != m}
        profiles.append(dataclasses.replace(profile, stacking_slowdown=others))
    d = Deployment(profiles, [App(m, (m,)) for m in names])
    rows: dict[str, Any] = {}
    for p in P_VALUES:
        qs = queries(args.queries, args.interval_ms, p, GPU_REGULAR, GPU_ADHOC,
                     np.random.default_rng(args.seed))  # fmt: skip
        w = as_workload(qs, args.deadline_ms)
        rows[str(p)] = {}
        for name in POLICIES:
            out = simulate(d, make_policy(name), w)
            lat = list(out.latency_ms.values())
            rows[str(p)][name] = {
                "mean_ms": round(float(np.mean(lat)), 2),
                "dropped": len(out.dropped),
            }
        print(_row(p, rows[str(p)]), flush=True)
    return rows


def _row(p: float, r: dict[str, Any]) -> str:
    base = r["tfs"]["mean_ms"]
    cells = "  ".join(
        f"{n} {r[n]['mean_ms']:8.1f} ms (x{base / r[n]['mean_ms']:.2f})" for n in POLICIES
    )
    return f"p={p:.1f}  {cells}"


# --- the real server ----------------------------------------------------------------------------
def cpu_profiles_with_stacking(directory: Path) -> None:
    """Bundled CPU profiles of the served models, each with its measured stacking slowdown
    beside every other served model (one torch thread each, as the server's two lanes run)."""
    import torch

    from layerexec import zoo
    from layerexec.profiler import stacking_slowdown
    from scheduler.profile import dumps_profile

    torch.set_num_threads(1)
    names = [CPU_REGULAR[0], *(m for m, _ in CPU_ADHOC)]
    models = {m: zoo.load_model(m) for m in names}
    for m in names:
        doc = json.loads((PROFILES / f"{m}-cpu.json").read_text())
        doc["stacking"] = {
            o: {
                "batch": 1,
                # a median under 1 is noise (running beside another model never helps a model)
                "slowdown": max(1.0, stacking_slowdown(models[m], models[o], time.perf_counter)),
            }
            for o in names
            if o != m
        }
        print(f"stacking slowdown of {m}: {doc['stacking']}", flush=True)
        (directory / f"{m}-cpu.json").write_text(dumps_profile(doc))


async def drive(
    url: str, qs: list[tuple[float, str, int]], deadline_ms: float, jpegs: list[bytes]
) -> list[float]:
    """Send every query's samples at its time; completion times (ms) of the answered ones."""
    loop = asyncio.get_running_loop()
    out: list[float] = []

    async def one(s: aiohttp.ClientSession, app: str, i: int, sent: float) -> None:
        body = {"app": app, "deadline_ms": deadline_ms, "payload": {"jpeg": jpegs[i % len(jpegs)]}}
        async with s.post(f"{url}/v1/infer", data=msgpack.packb(body),
                          headers={"Content-Type": "application/msgpack"}) as r:  # fmt: skip
            doc = msgpack.unpackb(await r.read())
        if doc.get("status") == "ok":
            out.append((loop.time() - sent) * 1000.0)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        start = loop.time()
        tasks = []
        for t, app, size in qs:
            delay = start + t / 1000.0 - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = loop.time()
            tasks += [asyncio.create_task(one(s, app, k, sent)) for k in range(size)]
        await asyncio.gather(*tasks)
    return out


async def on_server(args: argparse.Namespace) -> dict[str, Any]:
    from client.demo import free_port, start_server, wait_ready
    from client.frames import jpeg, video_frames

    jpegs = [jpeg(f) for f in video_frames(limit=16, every=30)]
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cpu_profiles_with_stacking(Path(tmp))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        apps = ",".join([CPU_REGULAR[0], *(m for m, _ in CPU_ADHOC)])
        proc = start_server(port, "irina", ["--apps", apps, "--profiles", tmp, "--threads", "1"])
        try:
            await wait_ready(url, proc)
            async with aiohttp.ClientSession() as s:
                for p in args.server_p:
                    rows[str(p)] = {}
                    qs = queries(args.server_queries, args.server_interval_ms, p, CPU_REGULAR,
                                 CPU_ADHOC, np.random.default_rng(args.seed))  # fmt: skip
                    for name in POLICIES:
                        async with s.put(f"{url}/v1/policy", json={"policy": name}) as r:
                            assert r.status == 200, await r.text()
                        lat = await drive(url, qs, args.server_deadline_ms, jpegs)
                        n = sum(size for _, _, size in qs)
                        rows[str(p)][name] = {
                            "mean_ms": round(float(np.mean(lat)), 2) if lat else None,
                            "dropped": n - len(lat),
                        }
                        await asyncio.sleep(0.5)
                    print(_row(p, rows[str(p)]), flush=True)
                async with s.get(f"{url}/v1/status", headers={"Accept": "application/json"}) as r:
                    rows["status"] = await r.json()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    return rows


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for where, style in (("simulator", "-"), ("server", "--")):
        rows = doc.get(where) or {}
        ps = [p for p in rows if p != "status"]
        for name, colour in (
            ("irina", "tab:red"),
            ("dynamic", "tab:blue"),
            ("dp-time", "tab:green"),
        ):
            xs, ys = [], []
            for p in ps:
                r = rows[p]
                if r[name]["mean_ms"] and r["tfs"]["mean_ms"]:
                    xs.append(float(p))
                    ys.append(r["tfs"]["mean_ms"] / r[name]["mean_ms"])
            if xs:
                ax.plot(xs, ys, style, color=colour, marker="o", label=f"{name} ({where})")
    ax.axhspan(1.3, 2.5, color="grey", alpha=0.15, label="paper: irina 1.3x-2.5x")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xlabel("probability of an ad-hoc query, p")
    ax.set_ylabel("speedup in average completion time over tfs")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--interval-ms", type=float, default=120.0)
    ap.add_argument("--deadline-ms", type=float, default=200.0)
    ap.add_argument("--stack-slowdown", type=float, default=1.2)
    ap.add_argument("--no-server", action="store_true")
    ap.add_argument("--server-queries", type=int, default=60)
    ap.add_argument("--server-interval-ms", type=float, default=120.0)
    ap.add_argument("--server-deadline-ms", type=float, default=300.0)
    ap.add_argument("--server-p", type=lambda s: [float(x) for x in s.split(",")],
                    default=[0.1, 0.5, 0.9])  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench/results/irina.json"))
    args = ap.parse_args()
    print(f"simulator, V100 profiles, stacking slowdown assumed {args.stack_slowdown} "
          f"for every pair; speedup over tfs in brackets (paper: irina 1.3x-2.5x)")  # fmt: skip
    doc: dict[str, Any] = {"simulator": simulated(args)}
    if not args.no_server:
        print("real server on this CPU (stacking slowdowns measured here)")
        doc["server"] = asyncio.run(on_server(args))
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    png = Path(args.out).with_suffix(".png")
    plot(doc, png)
    print(f"wrote {args.out} and {png}")


if __name__ == "__main__":
    main()

"""`layerbatch client` and `layerbatch loadgen`: set up from flags, run, report.

The flags are parsed in layerbatch.py; these functions take the namespace. Bad input (an unknown
app, a missing video, a malformed trace) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from client.device import TorchDevice, replay_features
from client.fleet import Fleet, capacity, run_fleet, sweep
from client.mobile import FrameRecord, MobileClient, Once, arrivals_ms, summary
from client.remote import Remote
from client.source import Frame, load_frames
from layerexec import zoo
from traces.network import Link, LinkTrace, resolve_trace

REPLAY_FRAMES = 8  # distinct frames whose feature maps the simulated clients send
HEALTH_TIMEOUT_S = 5.0  # how long the server has to answer before a run


def _say(message: str) -> None:
    print(f"client: {message}", file=sys.stderr)


def _inputs(ns: argparse.Namespace) -> tuple[zoo.StagedModel, list[Frame], Any, Any]:
    """Model, frames and traces from the flags; ValueError (one sentence) if any is bad."""
    spec = zoo.spec(ns.app)
    frames = load_frames(getattr(ns, "source", "") or _video(), spec, ns.frames, ns.seed)
    uplink = resolve_trace(ns.uplink).scaled(ns.link_scale) if ns.uplink else None
    downlink = resolve_trace(ns.downlink).scaled(ns.link_scale) if ns.downlink else None
    return zoo.load_model(ns.app), frames, uplink, downlink


def _video() -> str:
    from client.frames import BUNDLED_VIDEO

    return str(BUNDLED_VIDEO)


def _tensorrt() -> bool:
    """Local layers run with TensorRT when it imports and a CUDA GPU is present."""
    from layerexec.trt import available

    return available()[0]


def _describe_device(device: TorchDevice, frames: Sequence[Frame]) -> None:
    est = device.calibrate(frames[:1])
    local = sum(est.stage_ms)
    _say(
        f"{device.model.name} with {device.backend} x{device.slowdown:g}: {local:.1f} ms for its "
        f"{device.n_stages} stages; JPEG {est.payload_bytes[0] / 1e3:.1f} kB, feature maps "
        f"{min(est.payload_bytes[1:], default=0) / 1e3:.1f}-"
        f"{max(est.payload_bytes[1:], default=0) / 1e3:.1f} kB"
    )


def _checked_inputs(ns: argparse.Namespace, verb: str, measures_server: bool) -> Any:
    """`_inputs`, or None after saying in one line what is wrong. A run that `measures_server`
    needs it to answer first: a client runs its frames locally while its server is away (and
    says so once), but a load test of a server that is not there would measure nothing."""
    try:
        inputs = _inputs(ns)
    except ValueError as exc:
        print(f"layerbatch {verb}: {exc}", file=sys.stderr)
        return None
    why = asyncio.run(_not_serving(ns.server, ns.app)) if measures_server else None
    if why is not None:
        print(f"layerbatch {verb}: {why}", file=sys.stderr)
        return None
    return inputs


async def _not_serving(server: str, app: str) -> str | None:
    """None when `server` answers GET /v1/models listing `app`; else why not, in a sentence."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)) as s,
            s.get(server.rstrip("/") + "/v1/models", headers={"Accept": "application/json"}) as r,
        ):
            served = (await r.json()).get("apps", {}) if r.status == 200 else None
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
        return (
            f"--server: could not reach {server} ({str(exc) or type(exc).__name__}); expected a "
            "running `layerbatch serve`"
        )
    if not isinstance(served, dict):
        return f"--server: {server}/v1/models did not list apps; expected a `layerbatch serve`"
    if app not in served:
        return f"--app: expected an app the server serves ({', '.join(sorted(served))}), got {app}"
    return None


def client_command(ns: argparse.Namespace) -> int:
    times = arrivals_ms(ns.duration, ns.fps, ns.rate, np.random.default_rng(ns.seed))
    if not times:  # a run that would measure nothing (it printed "requests: 0" and exit 0)
        print(
            f"layerbatch client: no request arrives within --duration {ns.duration:g} s at "
            f"--rate {ns.rate:g} req/s (Poisson arrivals, --seed {ns.seed}); raise --rate or "
            "--duration",
            file=sys.stderr,
        )
        return 2
    inputs = _checked_inputs(ns, "client", measures_server=False)
    if inputs is None:
        return 2
    model, frames, uplink, downlink = inputs
    records = asyncio.run(_client(ns, model, frames, uplink, downlink, times))
    doc: dict[str, Any] = {"summary": summary(records), "records": [r.as_json() for r in records]}
    _print_summary(doc["summary"])
    if ns.json_out:
        Path(ns.json_out).write_text(json.dumps(doc, indent=1) + "\n")
    if ns.plot:
        from client.plot import plot_client

        plot_client(
            records, ns.deadline_ms, ns.plot, uplink, ns.uplink_offset_s * 1000.0,
            f"{ns.app}, offload {ns.offload}, deadline {ns.deadline_ms:g} ms",
        )  # fmt: skip
        print(f"plot: {ns.plot}")
    return 0


async def _client(
    ns: argparse.Namespace,
    model: zoo.StagedModel,
    frames: list[Frame],
    uplink: LinkTrace | None,
    downlink: LinkTrace | None,
    times: list[float],
) -> list[FrameRecord]:
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    def clock_ms() -> float:  # from the start of the run: link time 0 is trace time offset
        return (loop.time() - t0) * 1000.0

    device = TorchDevice(model, clock_ms, ns.client_slowdown, ns.client_threads, _tensorrt())
    try:
        _describe_device(device, frames)
        offset_ms = ns.uplink_offset_s * 1000.0
        async with aiohttp.ClientSession() as session:
            remote = Remote(
                ns.server, ns.app, session, clock_ms,
                Link(uplink, offset_ms) if uplink else None,
                Link(downlink, offset_ms) if downlink else None,
                estimates=[None] * device.n_stages,
            )  # fmt: skip
            client = MobileClient(
                "client0", device, remote, ns.offload, ns.deadline_ms, clock_ms, Once(_say)
            )
            return await client.run(frames, times)
    finally:
        device.close()


def loadgen_command(ns: argparse.Namespace) -> int:
    inputs = _checked_inputs(ns, "loadgen", measures_server=True)
    if inputs is None:
        return 2
    model, frames, uplink, downlink = inputs
    device = TorchDevice(model, lambda: 0.0, ns.client_slowdown, ns.client_threads)
    _describe_device(device, frames)
    device.close()
    fleet = Fleet(
        ns.server, ns.app, frames[:REPLAY_FRAMES], device.estimates,
        replay_features(model, frames[:REPLAY_FRAMES], ns.client_threads),
        uplink, downlink, ns.deadline_ms, ns.rate_per_client,
    )  # fmt: skip
    say = Once(_say)
    if ns.sweep:
        points = asyncio.run(
            sweep(fleet, ns.clients, ("none", "binary", "partial"), ns.duration, ns.seed, say,
                  progress=print)
        )  # fmt: skip
        caps = {m: capacity(points, m) for m in ("none", "binary", "partial")}
        print("capacity (clients with on-time >= 0.9): " + ", ".join(
            f"{m} {c}" for m, c in caps.items()))  # fmt: skip
        doc: dict[str, Any] = {
            "capacity": caps,
            "points": [{"mode": p.mode, "clients": p.clients, **p.summary} for p in points],
        }
        if ns.plot:
            from client.plot import plot_sweep

            plot_sweep(points, ns.plot, f"{ns.app}, {ns.rate_per_client:g} req/s per client")
            print(f"plot: {ns.plot}")
    else:
        records = asyncio.run(
            run_fleet(fleet, ns.clients[0], ns.offload, ns.duration,
                      np.random.default_rng(ns.seed), say)
        )  # fmt: skip
        if not records:  # a run that measured nothing is no result (it printed "requests: 0")
            print(
                f"layerbatch loadgen: no request arrived within --duration {ns.duration:g} s "
                f"from --clients {ns.clients[0]} at --rate-per-client {ns.rate_per_client:g} "
                "req/s (Poisson arrivals); raise one of them",
                file=sys.stderr,
            )
            return 2
        doc = {
            "summary": {"clients": ns.clients[0], **summary(records)},
            "records": [r.as_json() for r in records],
        }
        _print_summary(doc["summary"])
    if ns.json_out:
        Path(ns.json_out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def _print_summary(s: dict[str, Any]) -> None:
    for key, value in s.items():
        print(f"{key:>16}: {value}")

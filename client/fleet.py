"""Many clients against one server (paper 003, section 6.5): `layerbatch loadgen`.

Each of the N clients is a Poisson stream of frames with its own replayed uplink (the same trace,
each from its own random offset) and its own device. As in the paper, the clients are simulated
in one process: their devices are `ReplayDevice`s holding the stage times measured on this
machine (times the slowdown) and sending feature maps computed here, so the server sees real
JPEGs and real H.264 feature maps. The server's estimates are fetched once for all clients.

Capacity is the largest N whose aggregate on-time ratio is at least 0.9; `sweep` measures it for
server-only (`none`), `binary` and `partial` offloading.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import numpy as np

from client.device import Estimates, ReplayDevice
from client.mobile import FrameRecord, MobileClient, arrivals_ms, summary
from client.offload import Mode
from client.remote import Remote
from client.source import Frame
from layerexec.features import EncodedFeatures
from traces.network import Link, LinkTrace

CAPACITY_ON_TIME = 0.9


@dataclass(frozen=True)
class Fleet:
    """What every simulated client shares: the app, frames, the measured device, the links."""

    url: str
    app: str
    frames: Sequence[Frame]
    estimates: Estimates  # measured on this machine, slowdown included
    features: dict[tuple[int, int], EncodedFeatures]  # (frame index, split) -> features
    uplink: LinkTrace | None
    downlink: LinkTrace | None
    deadline_ms: float
    rate_per_client_rps: float


async def run_fleet(
    fleet: Fleet,
    n_clients: int,
    mode: Mode,
    duration_s: float,
    rng: np.random.Generator,
    say: Callable[[str], None],
) -> list[FrameRecord]:
    """N clients for `duration_s`; one record per frame, all clients together."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    def clock_ms() -> float:  # from the start of the run: link time 0 is trace time offset
        return (loop.time() - t0) * 1000.0

    n_stages = len(fleet.estimates.stage_ms)
    shared: list[float | None] = [None] * n_stages
    n_frames = len({i for i, _ in fleet.features}) or len(fleet.frames)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        clients = []
        for c in range(n_clients):
            device = ReplayDevice(_copy(fleet.estimates), fleet.features, n_frames, clock_ms)
            remote = Remote(
                fleet.url,
                fleet.app,
                session,
                clock_ms,
                _link(fleet.uplink, rng),
                _link(fleet.downlink, rng),
                estimates=shared,
            )
            client = MobileClient(
                f"client{c}", device, remote, mode, fleet.deadline_ms, clock_ms, say
            )
            times = arrivals_ms(duration_s, None, fleet.rate_per_client_rps, rng)
            clients.append(client.run(fleet.frames, times, refresh=c == 0))
        runs = await asyncio.gather(*clients)
    return [r for run in runs for r in run]


def _link(trace: LinkTrace | None, rng: np.random.Generator) -> Link | None:
    if trace is None:
        return None
    return Link(trace, offset_ms=float(rng.uniform(0, trace.period_ms)))


def _copy(e: Estimates) -> Estimates:
    return replace(
        e,
        stage_ms=list(e.stage_ms),
        encode_ms=list(e.encode_ms),
        payload_bytes=list(e.payload_bytes),
    )


@dataclass(frozen=True)
class SweepPoint:
    mode: str
    clients: int
    summary: dict[str, Any]


async def sweep(
    fleet: Fleet,
    clients: Sequence[int],
    modes: Sequence[Mode],
    duration_s: float,
    seed: int,
    say: Callable[[str], None],
    progress: Callable[[str], None],
    settle_s: float = 1.0,
) -> list[SweepPoint]:
    """On-time ratio against N for each mode; each run starts from an idle server."""
    points = []
    for mode in modes:
        for n in clients:
            records = await run_fleet(fleet, n, mode, duration_s, np.random.default_rng(seed), say)
            s = summary(records)
            points.append(SweepPoint(mode, n, s))
            progress(
                f"{mode:>8} x {n:3d} clients: on-time {s['on_time_ratio']}, "
                f"offloaded {s['offloaded_share']}, mean {s['mean_ms']} ms"
            )
            await asyncio.sleep(settle_s + fleet.deadline_ms / 1000.0)
    return points


def capacity(points: Sequence[SweepPoint], mode: str) -> int:
    """The largest N at which `mode` kept the on-time ratio >= 0.9 (0 if none)."""
    ok = [
        p.clients
        for p in points
        if p.mode == mode and (p.summary["on_time_ratio"] or 0.0) >= CAPACITY_ON_TIME
    ]
    return max(ok, default=0)

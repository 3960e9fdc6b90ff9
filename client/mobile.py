"""One mobile client: frames arrive, each is run locally, sent whole, or split (paper 003 §4.4).

For every frame the client builds the `Costs` of its options from what it knows now (its device's
queue and measured stage times, its uplink estimate and queue, the server's latest estimates),
lets `offload.decide` pick the split, and carries it out:

    local:   device runs [0, N)
    full:    the frame's JPEG goes through the uplink to the server
    partial: device runs [0, k), quantises and H.264-encodes the features, sends them

If the server cannot be reached or errors, the frame is finished locally (the client says so
once and counts it as a fallback). Each frame gives one `FrameRecord`; its total time runs from
the frame's arrival to its answer, on the client's clock.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from client.device import Estimates, Piece
from client.offload import Costs, Decision, Mode, decide
from client.remote import Remote, ServerError
from client.source import Frame

REFRESH_S = 0.5  # how often the server's estimates are fetched (answers refresh position 0)


class Device(Protocol):
    estimates: Estimates

    @property
    def n_stages(self) -> int: ...

    def wait_ms(self) -> float: ...

    async def run(self, frame: Frame, split: int, predicted_ms: float) -> Piece: ...

    async def finish(self, piece: Piece) -> float: ...


@dataclass(frozen=True)
class FrameRecord:
    """One frame's fate; times in ms, `arrival_s` from the start of the run."""

    client: str
    frame: int
    arrival_s: float
    decision: str  # "local", "full" or "partial"
    split: int
    predicted_ms: float  # what the decision expected the total to be
    status: str  # "ok", "dropped" (by the server) or "fallback" (finished locally)
    bytes_sent: int
    local_ms: float  # on the device, queueing included
    encode_ms: float
    transmit_ms: float
    server_ms: float
    total_ms: float
    on_time: bool
    uplink_estimate_mbps: float

    def as_json(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


class Once:
    """Says each distinct message once (a fallback is reported once, then counted)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.seen: set[str] = set()

    def __call__(self, message: str) -> None:
        if message not in self.seen:
            self.seen.add(message)
            self.say(message)


class MobileClient:
    def __init__(
        self,
        name: str,
        device: Device,
        remote: Remote,
        mode: Mode,
        deadline_ms: float,
        clock_ms: Callable[[], float],
        say: Callable[[str], None],
    ) -> None:
        self.name = name
        self.device = device
        self.remote = remote
        self.mode = mode
        self.deadline_ms = deadline_ms
        self.clock_ms = clock_ms
        self.say = say if isinstance(say, Once) else Once(say)

    def costs(self) -> Costs:
        est = self.device.estimates
        return Costs(
            est.stage_ms,
            est.encode_ms,
            est.payload_bytes,
            list(self.remote.estimates),
            self.device.wait_ms(),
            self.remote.uplink_wait_ms(),
        )

    def positions_to_refresh(self) -> list[int]:
        if self.mode == "local":
            return []
        return list(range(self.device.n_stages)) if self.mode == "partial" else [0]

    async def handle(self, frame: Frame, arrival_ms: float, start_ms: float) -> FrameRecord:
        d = decide(self.mode, self.costs(), self.remote.throughput, self.deadline_ms)
        est = self.device.estimates
        if d.kind == "local":
            done = await self.device.run(frame, d.split, sum(est.stage_ms))
            return self._record(frame, arrival_ms, start_ms, d, "ok", done, 0, 0.0, 0.0)
        piece: Piece | None = None
        if d.split > 0:
            busy_ms = sum(est.stage_ms[: d.split]) + est.encode_ms[d.split]
            piece = await self.device.run(frame, d.split, busy_ms)
            assert piece.features is not None
            f = piece.features
            payload: dict[str, Any] = {
                "features": {
                    "position": f.position,
                    "shape": list(f.shape),
                    "scale": f.scale,
                    "zero_point": f.zero_point,
                    "codec": f.codec,
                    "data": f.data,
                }
            }
        else:
            payload = {"jpeg": frame.jpeg}
        left_ms = self.deadline_ms - (self.clock_ms() - arrival_ms)
        body = {
            "app": self.remote.app,
            "deadline_ms": max(1.0, left_ms),
            "request_id": f"{self.name}-{frame.index}-{arrival_ms:.0f}",
            "client_id": self.name,
            "payload": payload,
        }
        try:
            answer = await self.remote.infer(body, timeout_s=max(5.0, 3 * self.deadline_ms / 1e3))
        except ServerError as exc:
            self.say(f"{exc}; finishing frames locally while it is")
            if piece is None:
                piece = await self.device.run(frame, self.device.n_stages, sum(est.stage_ms))
                return self._record(frame, arrival_ms, start_ms, d, "fallback", piece, 0, 0, 0)
            extra = await self.device.finish(piece)
            done = Piece(piece.split, piece.wait_ms, piece.local_ms + extra, piece.encode_ms, None)
            return self._record(frame, arrival_ms, start_ms, d, "fallback", done, 0, 0, 0)
        encode = piece.encode_ms if piece is not None else 0.0
        self.device.estimates.observe(d.split, encode, answer.bytes_sent)
        if piece is None:
            piece = Piece(0, 0.0, 0.0, 0.0, None)
        return self._record(
            frame,
            arrival_ms,
            start_ms,
            d,
            answer.status,
            piece,
            answer.bytes_sent,
            answer.transmit_ms,
            answer.server_ms,
        )

    def _record(
        self,
        frame: Frame,
        arrival_ms: float,
        start_ms: float,
        d: Decision,
        status: str,
        piece: Piece,
        nbytes: int,
        transmit_ms: float,
        server_ms: float,
    ) -> FrameRecord:
        total = self.clock_ms() - arrival_ms
        return FrameRecord(
            self.name,
            frame.index,
            (arrival_ms - start_ms) / 1000.0,
            d.kind,
            d.split,
            d.predicted_ms,
            status,
            nbytes,
            piece.wait_ms + piece.local_ms,
            piece.encode_ms,
            transmit_ms,
            server_ms,
            total,
            status != "dropped" and total <= self.deadline_ms,
            self.remote.throughput.bytes_per_ms * 8e3 / 1e6,
        )

    async def refresh_forever(self, period_s: float = REFRESH_S) -> None:
        """Keep the server's estimates fresh; an unreachable server is said once."""
        positions = self.positions_to_refresh()
        if not positions:
            return
        while True:
            try:
                await self.remote.refresh(positions)
            except ServerError as exc:
                self.say(f"{exc}; finishing frames locally while it is")
            await asyncio.sleep(period_s)

    async def run(
        self, frames: Sequence[Frame], arrivals_ms: Sequence[float], refresh: bool = True
    ) -> list[FrameRecord]:
        """Frame i % len(frames) arrives at arrivals_ms[i] (from now); every frame is handled
        on its own task (open loop: a slow frame never delays the next arrival). `refresh`:
        this client keeps the server's estimates fresh (one client per shared estimate list)."""
        start = self.clock_ms()
        refresher = asyncio.create_task(self.refresh_forever() if refresh else asyncio.sleep(0))
        try:
            if refresh and self.positions_to_refresh():
                try:
                    await self.remote.refresh(self.positions_to_refresh())
                except ServerError as exc:
                    self.say(f"{exc}; finishing frames locally while it is")
            tasks = []
            for i, t in enumerate(arrivals_ms):
                delay = start + t - self.clock_ms()
                if delay > 0:
                    await asyncio.sleep(delay / 1000.0)
                frame = frames[i % len(frames)]
                tasks.append(asyncio.create_task(self.handle(frame, start + t, start)))
            return list(await asyncio.gather(*tasks))
        finally:
            refresher.cancel()


def summary(records: Sequence[FrameRecord]) -> dict[str, Any]:
    """The run's figures (issue 5's --json-out summary), over all frames."""
    n = len(records)
    totals = [r.total_ms for r in records if r.status != "dropped"]
    sent = [r for r in records if r.decision != "local" and r.status != "fallback"]
    return {
        "requests": n,
        "on_time_ratio": round(sum(r.on_time for r in records) / n, 4) if n else None,
        "mean_ms": round(float(np.mean(totals)), 2) if totals else None,
        "p99_ms": round(float(np.percentile(totals, 99)), 2) if totals else None,
        "offloaded_share": round(len(sent) / n, 4) if n else None,
        "bytes_per_frame": round(sum(r.bytes_sent for r in records) / n, 1) if n else None,
        "fallbacks": sum(r.status == "fallback" for r in records),
        "dropped": sum(r.status == "dropped" for r in records),
        "decisions": {
            k: sum(r.decision == k for r in records) for k in ("local", "full", "partial")
        },
    }


def arrivals_ms(
    duration_s: float, fps: float | None, rate_rps: float | None, rng: np.random.Generator
) -> list[float]:
    """Frame arrival times in [0, duration): every 1/fps s, or Poisson at `rate_rps`."""
    if fps is not None:
        steps = (i * 1000.0 / fps for i in range(math.ceil(duration_s * fps) + 1))
        return [t for t in steps if t < duration_s * 1000.0]
    assert rate_rps is not None
    times = np.cumsum(rng.exponential(1000.0 / rate_rps, int(rate_rps * duration_s * 2) + 20))
    return [float(t) for t in times[times < duration_s * 1000.0]]

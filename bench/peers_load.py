"""bench/peers.py's open-loop load generator: one request in each server's protocol, the
arrivals sent and each answer timed from when it was due, and a run's summary."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.peers_busy import busy_counters, busy_shares
from bench.peers_servers import Running


@dataclass(frozen=True)
class Sample:
    due_s: float  # when it was due to be sent, from the start of the run
    status: str  # "ok", "dropped", "timeout", "error", "http-<code>"
    ms: float  # from due time to answer (or to giving up)


def summarize(samples: Sequence[Sample], deadline_ms: float, duration_s: float) -> dict[str, Any]:
    """On-time ratio (answered OK within the deadline), mean and p99 of the answered-OK requests'
    completion times, and counts."""
    n = len(samples)
    ok = [s.ms for s in samples if s.status == "ok"]
    on_time = sum(1 for s in samples if s.status == "ok" and s.ms <= deadline_ms)
    return {
        "requests": n,
        "on_time_ratio": round(on_time / n, 4) if n else None,
        "served": len(ok),
        "dropped": sum(s.status == "dropped" for s in samples),
        "timeouts": sum(s.status == "timeout" for s in samples),
        "errors": sum(s.status not in ("ok", "dropped", "timeout") for s in samples),
        "mean_ms": round(float(np.mean(ok)), 2) if ok else None,
        "p99_ms": round(float(np.percentile(ok, 99)), 2) if ok else None,
        "goodput_rps": round(on_time / duration_s, 2) if duration_s > 0 else None,
    }


@dataclass(frozen=True)
class Protocol:
    """How the load generator talks to one server: the URL path, the body of one request, and
    what an answer means."""

    server: str
    model: str

    @property
    def path(self) -> str:
        return {
            "layerbatch": "/v1/infer",
            "triton": f"/v2/models/{self.model}/infer",
            "ray": f"/{self.model}",
            "torchserve": f"/predictions/{self.model}",
        }[self.server]

    def request(self, jpeg: bytes, deadline_ms: float) -> tuple[bytes, dict[str, str]]:
        if self.server == "layerbatch":
            import msgpack

            body = {"app": self.model, "deadline_ms": deadline_ms, "payload": {"jpeg": jpeg}}
            data: bytes = msgpack.packb(body, use_bin_type=True)
            return data, {"Content-Type": "application/msgpack"}
        if self.server == "triton":
            return triton_body(jpeg)
        return jpeg, {"Content-Type": "application/octet-stream"}

    def answer(self, http_status: int, raw: bytes) -> tuple[str, int | None]:
        """(status, top-1 class or None)."""
        if http_status != 200:
            return f"http-{http_status}", None
        try:
            if self.server == "layerbatch":
                import msgpack

                doc = msgpack.unpackb(raw)
                status = str(doc.get("status", "error"))
                top = doc.get("result", {}).get("top5") if status == "ok" else None
                return status, int(top[0]["class"]) if top else None
            doc = json.loads(raw)
            if self.server == "triton":
                out = {o["name"]: o["data"] for o in doc["outputs"]}
                return "ok", int(out["classes"][0])
            return "ok", int(doc["classes"][0])
        except (ValueError, KeyError, TypeError, IndexError):
            return "error", None


def triton_body(jpeg: bytes) -> tuple[bytes, dict[str, str]]:
    """A KServe v2 request with the JPEG as one BYTES element in Triton's binary extension (the
    JSON header, then the element as a 4-byte little-endian length and the bytes)."""
    blob = struct.pack("<I", len(jpeg)) + jpeg
    header = {
        "inputs": [
            {
                "name": "jpeg",
                "shape": [1, 1],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(blob)},
            }
        ],
        "outputs": [
            {"name": "classes", "parameters": {"binary_data": False}},
            {"name": "scores", "parameters": {"binary_data": False}},
        ],
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    return head + blob, {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(head)),
    }


class ExitedEarly(RuntimeError):
    """A server's process ended before it answered its first request."""


class Load:
    """The open-loop load generator for one running server: the same arrivals and frames for
    every server, each request in that server's protocol."""

    def __init__(self, run: Running, frames: Sequence[bytes], deadline_ms: float) -> None:
        import aiohttp

        self.run = run
        self.proto = Protocol(run.server, run.model)
        self.frames = frames
        self.set_deadline(deadline_ms)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        self.idle_ms: float | None = None
        self.top1: int | None = None

    def set_deadline(self, deadline_ms: float) -> None:
        """The deadline requests carry (layerbatch's) and the client gives up at."""
        self.deadline_ms = deadline_ms
        self.bodies = [self.proto.request(f, deadline_ms) for f in self.frames]

    async def close(self) -> None:
        await self.session.close()

    async def busy(self) -> dict[str, float] | None:
        """layerbatch's busy counters (bench/peers_busy.py); None for the peers."""
        if self.run.server != "layerbatch":
            return None
        async with self.session.get(self.run.url + "/metrics") as r:
            return busy_counters(await r.text())

    async def one(self, i: int, give_up_s: float) -> tuple[str, float, int | None]:
        import aiohttp

        loop = asyncio.get_running_loop()
        body, headers = self.bodies[i % len(self.bodies)]
        t0 = loop.time()
        try:
            async with self.session.post(
                self.run.url + self.proto.path,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=give_up_s),
            ) as r:
                raw = await r.read()
                status, top1 = self.proto.answer(r.status, raw)
        except TimeoutError:
            status, top1 = "timeout", None
        except (aiohttp.ClientError, OSError):
            status, top1 = "error", None
        return status, (loop.time() - t0) * 1000.0, top1

    async def ready(self, timeout_s: float = 600.0) -> None:
        """Until a probe is answered OK (then a short warm-up and the idle latency)."""
        end = time.monotonic() + timeout_s
        while True:
            if self.run.proc.poll() is not None:
                raise ExitedEarly(
                    f"{self.run.server} exited ({self.run.proc.returncode}):\n{self.run.tail()}"
                )
            status, _, top1 = await self.one(0, 30.0)
            if status == "ok":
                self.top1 = top1
                break
            if time.monotonic() > end:
                raise RuntimeError(f"{self.run.server} not ready in {timeout_s:g} s")
            await asyncio.sleep(1.0)
        self.run.ready_s = time.monotonic() - self.run.started
        lat = [(await self.one(i, 30.0))[1] for i in range(12)]
        self.idle_ms = float(np.median(lat[4:]))

    async def quiesce(self, max_s: float = 60.0) -> float:
        """Wait until a backlog left by an overloaded run (e.g. requests the client gave up on,
        which TorchServe and Triton still run) has drained: until a probe is answered within
        max(2 x the idle latency + 30 ms, half the deadline); after 20 s, also once two probes in
        a row take about as long (no longer draining: the machine is just busier now)."""
        assert self.idle_ms is not None
        t0 = time.monotonic()
        ok_ms = max(2.0 * self.idle_ms + 30.0, 0.5 * self.deadline_ms)
        prev: float | None = None
        while time.monotonic() - t0 < max_s:
            status, ms, _ = await self.one(0, 30.0)
            if status == "ok" and (
                ms <= ok_ms
                or (time.monotonic() - t0 > 20.0 and prev is not None and ms >= 0.9 * prev)
            ):
                break
            prev = ms if status == "ok" else None
            await asyncio.sleep(0.3)
        return time.monotonic() - t0

    async def run_arrivals(self, arrivals_s: np.ndarray, give_up_s: float) -> list[Sample]:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.05

        async def send(i: int, due: float) -> Sample:
            status, _, _ = await self.one(i, give_up_s)
            return Sample(due, status, (loop.time() - (start + due)) * 1000.0)

        tasks = []
        for i, due in enumerate(arrivals_s):
            delay = start + float(due) - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(i, float(due))))
        return list(await asyncio.gather(*tasks))


@dataclass(frozen=True)
class Run:
    """One measured rate: its samples, how long the arrivals lasted and, where the server died
    during them, its exit status."""

    samples: list[Sample]
    duration_s: float
    server_exited: int | None = None

    def summary(self, deadline_ms: float) -> dict[str, Any]:
        s = summarize(self.samples, deadline_ms, self.duration_s)
        return s if self.server_exited is None else {**s, "server_exited": self.server_exited}


async def measure_alone(
    load: Load,
    others: Mapping[str, Load],
    arrivals_s: np.ndarray,
    duration_s: float,
    deadline_ms: float,
    pause: bool = True,
) -> dict[str, Any]:
    """`load`'s server serves `arrivals_s` while `others` (servers up beside it) are idle, and
    stopped (SIGSTOP) with `pause`; its summary, with the CPU seconds each other server used
    meanwhile ("others_cpu_s"), the client's share of a core and, where the server says, its
    busy shares. The interleaved runs, the tuning's settling and `bench/server_ab.py` all measure
    a server this way."""
    runs = {n: x.run for n, x in others.items()}
    await load.quiesce()  # e.g. timers it missed while paused
    cpu0_s = {n: r.cpu_s() for n, r in runs.items()}
    try:
        if pause:
            for r in runs.values():
                r.pause(True)
        busy0, t0_s = await load.busy(), time.monotonic()
        client0_s = time.process_time()
        samples = await load.run_arrivals(arrivals_s, deadline_ms / 1000.0)
        client_cpu_s = time.process_time() - client0_s
        wall_ms = (time.monotonic() - t0_s) * 1000.0
        busy1 = await load.busy()
        await load.quiesce()
        others_cpu_s = {n: r.cpu_s() - cpu0_s[n] for n, r in runs.items()}
    finally:
        for r in runs.values():
            r.pause(False)
    s = summarize(samples, deadline_ms, duration_s)
    s["others_cpu_s"] = {n: round(v, 2) for n, v in others_cpu_s.items()}
    s["client_cpu_share"] = round(client_cpu_s * 1000.0 / wall_ms, 4)
    if busy0 is not None and busy1 is not None:
        s["busy_share"] = busy_shares(busy0, busy1, wall_ms)
    return s

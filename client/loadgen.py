"""An open-loop load generator: requests at Poisson arrival times, whatever the answers do.

Each request is sent at its arrival time on its own task (a slow answer never delays the next
send), as msgpack over HTTP to /v1/infer, and its completion time is measured by the client from
the moment it was due to be sent. Time comes from the event loop's clock; randomness from the
generator passed in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgpack
import numpy as np


@dataclass(frozen=True)
class Record:
    app: str
    due_s: float  # when it was sent, from the start of the run
    status: str  # "ok", "dropped", "error", or "http-<code>"
    total_ms: float  # measured by the client
    deadline_ms: float
    server: dict[str, Any] | None

    @property
    def on_time(self) -> bool:
        return self.status == "ok" and self.total_ms <= self.deadline_ms


async def run_load(
    url: str,
    apps: Sequence[str],
    frames: Sequence[bytes],
    rate_rps: float,
    duration_s: float,
    deadline_ms: float,
    rng: np.random.Generator,
    session: aiohttp.ClientSession | None = None,
) -> list[Record]:
    """Poisson arrivals at `rate_rps` for `duration_s`, each a frame (round robin) for an app
    drawn uniformly from `apps`; returns one record per request, in sending order."""
    gaps = rng.exponential(1.0 / rate_rps, int(rate_rps * duration_s * 2) + 10)
    times = np.cumsum(gaps)
    times = times[times < duration_s]
    picks = rng.integers(0, len(apps), len(times))
    own = session is None
    sess = session or aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        tasks = []
        for i, (t, a) in enumerate(zip(times, picks, strict=True)):
            delay = start + float(t) - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            body = {
                "app": apps[int(a)],
                "deadline_ms": deadline_ms,
                "payload": {"jpeg": frames[i % len(frames)]},
            }
            tasks.append(asyncio.create_task(_send(sess, url, body, float(t), start)))
        return list(await asyncio.gather(*tasks))
    finally:
        if own:
            await sess.close()


async def _send(
    sess: aiohttp.ClientSession, url: str, body: dict[str, Any], due_s: float, start: float
) -> Record:
    loop = asyncio.get_running_loop()
    data = msgpack.packb(body, use_bin_type=True)
    sent = start + due_s
    try:
        async with sess.post(
            f"{url}/v1/infer", data=data, headers={"Content-Type": "application/msgpack"}
        ) as resp:
            raw = await resp.read()
            doc = msgpack.unpackb(raw) if resp.content_type == "application/msgpack" else None
            status = (
                doc.get("status", "error") if resp.status == 200 and doc else f"http-{resp.status}"
            )
    except aiohttp.ClientError as exc:
        doc, status = {"error": str(exc)}, "error"
    total = (loop.time() - sent) * 1000.0
    return Record(body["app"], due_s, str(status), total, body["deadline_ms"], doc)


def summary(records: Sequence[Record], duration_s: float) -> dict[str, Any]:
    """On-time ratio, mean and p99 completion of served requests, throughput."""
    ok = [r.total_ms for r in records if r.status == "ok"]
    n = len(records)
    return {
        "requests": n,
        "on_time_ratio": round(sum(r.on_time for r in records) / n, 4) if n else None,
        "served": len(ok),
        "dropped": sum(r.status == "dropped" for r in records),
        "errors": sum(r.status not in ("ok", "dropped") for r in records),
        "mean_ms": round(float(np.mean(ok)), 2) if ok else None,
        "p99_ms": round(float(np.percentile(ok, 99)), 2) if ok else None,
        "throughput_rps": round(len(ok) / duration_s, 2),
    }

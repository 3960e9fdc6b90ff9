"""The edge server as a client sees it: through its uplink and downlink, with estimates.

Bytes leave through the uplink (a replayed trace when one is given: the request body is
delivered at the trace's opportunities behind the client's earlier messages, and only then
POSTed), the answer comes back through the downlink. The uplink throughput estimate is
updated from every transfer (paper 003, section 4.4: EWMA, weight 0.3); without a trace the
real network is measured (round trip minus the server's own time). The server's completion
estimate per entry position is refreshed from `/v1/estimate` and from every answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgpack

from client.link_pacing import send_paced
from client.offload import ThroughputEstimate
from traces.network import Link

PRIOR_MBPS = 10.0  # the uplink estimate before the first transfer


class ServerError(Exception):
    """The server could not be reached or did not answer 200; the message says which."""


@dataclass(frozen=True)
class Answer:
    status: str  # "ok" or "dropped"
    server_ms: float  # the server's own time for the request (its timing.total_ms)
    transmit_ms: float  # uplink (queueing included) + downlink + the rest of the round trip
    bytes_sent: int
    doc: dict[str, Any]


def mbps_to_bytes_per_ms(mbps: float) -> float:
    return mbps * 1e6 / 8.0 / 1000.0


class Remote:
    """One client's view of the server for one app (module docstring)."""

    def __init__(
        self,
        url: str,
        app: str,
        session: aiohttp.ClientSession,
        clock_ms: Callable[[], float],
        uplink: Link | None = None,
        downlink: Link | None = None,
        estimates: list[float | None] | None = None,
    ) -> None:
        """`estimates`: the server's estimate per entry position, shared by the clients of one
        app in one process (updated in place); a new list of one position if not given."""
        self.url = url.rstrip("/")
        self.app = app
        self.session = session
        self.clock_ms = clock_ms
        self.uplink = uplink
        self.downlink = downlink
        self.throughput = ThroughputEstimate(mbps_to_bytes_per_ms(PRIOR_MBPS))
        self.estimates: list[float | None] = [None] if estimates is None else estimates

    def uplink_wait_ms(self) -> float:
        """How long a message sent now waits behind this client's earlier ones."""
        if self.uplink is None:
            return 0.0
        return max(0.0, self.uplink.busy_until_ms - self.clock_ms())

    async def infer(self, body: dict[str, Any], timeout_s: float) -> Answer:
        """Send one request through the link; ServerError if there is no usable answer."""
        data = msgpack.packb(body, use_bin_type=True)
        start = self.clock_ms()
        await self._through(self.uplink, len(data), measure=True)
        posted = self.clock_ms()
        try:
            async with self.session.post(
                f"{self.url}/v1/infer",
                data=data,
                headers={"Content-Type": "application/msgpack"},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise ServerError(f"{self.url} answered HTTP {resp.status}: {_reason(raw)}")
                doc = msgpack.unpackb(raw)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ServerError(f"{self.url} is unreachable ({exc or type(exc).__name__})") from None
        server_ms = float(doc.get("timing", {}).get("total_ms", 0.0))
        rest_ms = max(0.0, self.clock_ms() - posted - server_ms)
        if self.uplink is None:  # measure the real network: the round trip less the server
            self.throughput.update(len(data), max(rest_ms, 0.01))
        await self._through(self.downlink, len(raw), measure=False)
        self.observe_estimate(0, doc.get("estimate_ms"))
        transmit_ms = self.clock_ms() - start - server_ms
        return Answer(str(doc.get("status", "error")), server_ms, transmit_ms, len(data), doc)

    async def _through(self, link: Link | None, nbytes: int, measure: bool) -> float:
        """Wait until `nbytes` sent now are delivered by `link`; returns the ms waited."""
        if link is None:
            return 0.0
        now = self.clock_ms()
        begins = max(now, link.busy_until_ms)
        done = await send_paced(link, nbytes, self.clock_ms)
        if measure:
            self.throughput.update(nbytes, done - begins)
        return done - now

    def observe_estimate(self, position: int, value: Any) -> None:
        if position < len(self.estimates):
            self.estimates[position] = None if value is None else float(value)

    async def refresh(self, positions: Sequence[int], timeout_s: float = 2.0) -> None:
        """Fetch the server's estimate for entering now at each of `positions`; on failure all
        estimates become unknown (None: decisions then avoid the server) and ServerError."""
        try:
            for k in positions:
                async with self.session.get(
                    f"{self.url}/v1/estimate",
                    params={"app": self.app, "position": str(k)},
                    headers={"Accept": "application/msgpack"},
                    timeout=aiohttp.ClientTimeout(total=timeout_s),
                ) as resp:
                    raw = await resp.read()
                    if resp.status != 200:
                        raise ServerError(
                            f"{self.url} answered HTTP {resp.status} to /v1/estimate: "
                            f"{_reason(raw)}"
                        )
                    self.observe_estimate(k, msgpack.unpackb(raw).get("completion_ms"))
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.estimates[:] = [None] * len(self.estimates)
            raise ServerError(f"{self.url} is unreachable ({exc or type(exc).__name__})") from None
        except ServerError:
            self.estimates[:] = [None] * len(self.estimates)
            raise


def _reason(raw: bytes) -> str:
    try:
        doc = msgpack.unpackb(raw)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return raw[:200].decode("utf-8", "replace")
    return str(doc.get("error", doc)) if isinstance(doc, dict) else str(doc)

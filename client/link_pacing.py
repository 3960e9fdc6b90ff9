"""Pace sends by a `traces.network.Link`: wait (asyncio) until the link has delivered them.

`clock_ms` must read milliseconds on a clock that advances with real time (the event loop's
`loop.time() * 1000` by default in client/linkshell.py); the link's times are on that clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from traces.network import Link


async def sleep_until(deliver_ms: float, clock_ms: Callable[[], float]) -> None:
    """Return once clock_ms() >= deliver_ms (at once if it already is)."""
    while (remaining_ms := deliver_ms - clock_ms()) > 0:
        await asyncio.sleep(remaining_ms / 1000.0)


async def send_paced(link: Link, nbytes: int, clock_ms: Callable[[], float]) -> float:
    """Hand `nbytes` to `link` now and wait until the link delivers their last byte.

    Returns the delivery time (ms on `clock_ms`); when it returns, clock_ms() >= that time.
    """
    deliver_ms = link.transmit(nbytes, clock_ms())
    await sleep_until(deliver_ms, clock_ms)
    return deliver_ms

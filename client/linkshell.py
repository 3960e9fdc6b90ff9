"""linkshell: a TCP proxy that paces the bytes in each direction by a network trace.

`layerbatch linkshell --uplink UP --downlink DOWN --listen HOST:PORT --upstream HOST:PORT`
accepts TCP connections on --listen, opens one to --upstream for each, and forwards bytes both
ways: client -> upstream through the uplink trace, upstream -> client through the downlink trace
(like Mahimahi's `mm-link UP DOWN`, without root and for one port).

Model (see traces/network.py for the link itself):
- One shared `Link` per direction for all connections: the traces describe one radio link, so
  two connections share its capacity in FIFO order, as two apps on one phone would.
- Per connection and direction, a reader takes at most 16 KiB at a time from the socket; once
  there is room (at most QUEUE_CHUNKS chunks per direction and connection wait for delivery;
  the rest waits in the kernel's socket buffers, which is the backpressure) the chunk is handed
  to the link, which gives its delivery time, and a writer writes the chunks to the other side
  in order, each not before its delivery time (on `clock_ms`).
- The trace starts (trace time 0) when the proxy starts.
- EOF from one side is passed on after the bytes before it have been delivered; a reset or a
  failed write on either side closes both. An upstream that cannot be reached closes the
  client connection and logs one line; the proxy keeps accepting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable

from client.link_pacing import sleep_until
from traces.network import Link, LinkTrace, resolve_trace

CHUNK_BYTES = 16 * 1024
QUEUE_CHUNKS = 4  # per direction and connection: at most 64 KiB handed to the link, undelivered

_log = logging.getLogger(__name__)


def parse_hostport(text: str, *, any_port: bool = False) -> tuple[str, int]:
    """Split "HOST:PORT" (IPv6 as "[::1]:PORT") into (host, port); ValueError in one sentence
    if it is not one. Port 0 (listen on any free port) is accepted only with `any_port`."""
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    lowest = 0 if any_port else 1
    if "/" in host:  # a URL: http://127.0.0.1:8080 would connect to host "http://127.0.0.1"
        raise ValueError(f"{text!r}: expected HOST:PORT, not a URL, e.g. 127.0.0.1:9000")
    if not (sep and host and port.isascii() and port.isdigit()) or not lowest <= int(port) <= 65535:
        raise ValueError(
            f"{text!r}: expected HOST:PORT with a port from {lowest} to 65535, e.g. 127.0.0.1:9000"
        )
    return host, int(port)


async def serve_linkshell(
    uplink: LinkTrace,
    downlink: LinkTrace,
    listen: tuple[str, int],
    upstream: tuple[str, int],
    clock_ms: Callable[[], float] | None = None,
) -> asyncio.Server:
    """Start the proxy on `listen` (port 0: any free port) and return the listening server.

    `clock_ms` reads ms on a clock that advances with real time (default: the running loop's
    `loop.time() * 1000`). Closing the server stops accepting; open connections run on until
    either side closes them or their tasks are cancelled.
    """
    if clock_ms is None:
        loop = asyncio.get_running_loop()

        def clock_ms() -> float:
            return loop.time() * 1000.0

    clock = clock_ms
    start_ms = clock()
    up_link = Link(uplink, offset_ms=-start_ms)
    down_link = Link(downlink, offset_ms=-start_ms)

    async def handle(
        client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        peer = _address(client_writer.get_extra_info("peername"))
        try:
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        except OSError as exc:
            _log.warning(
                "linkshell: upstream %s:%d could not be reached for %s (%s); closed that "
                "connection",
                upstream[0],
                upstream[1],
                peer,
                _reason(exc),
            )
            client_writer.transport.abort()
            return
        finished = False
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(_pipe(client_reader, up_writer, up_link, clock))
                tasks.create_task(_pipe(up_reader, client_writer, down_link, clock))
            finished = True
        except* OSError:  # a reset or a broken pipe on either side ends both directions
            pass
        finally:
            for writer in (up_writer, client_writer):
                if finished:
                    writer.close()
                else:  # failed or cancelled: drop what is still buffered
                    writer.transport.abort()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    return await asyncio.start_server(handle, listen[0], listen[1])


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    link: Link,
    clock_ms: Callable[[], float],
) -> None:
    """Forward reader -> writer through `link` until EOF, then pass the EOF on."""
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
    room = asyncio.Semaphore(QUEUE_CHUNKS)

    async def take() -> None:
        while data := await reader.read(CHUNK_BYTES):
            await room.acquire()
            queue.put_nowait((link.transmit(len(data), clock_ms()), data))
        queue.put_nowait(None)

    async def give() -> None:
        while (item := await queue.get()) is not None:
            deliver_ms, data = item
            await sleep_until(deliver_ms, clock_ms)
            writer.write(data)
            await writer.drain()
            room.release()
        if writer.can_write_eof():
            writer.write_eof()

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(take())
        tasks.create_task(give())


def _reason(exc: OSError) -> str:
    """The errno text ("Connection refused") rather than asyncio's wrapping of it; for a host
    name that does not resolve, the resolver's words (its negative codes are not errnos)."""
    if isinstance(exc, socket.gaierror):
        return f"no address for that host ({exc.strerror})"
    return os.strerror(exc.errno) if exc.errno else str(exc)


def _address(sockname: object) -> str:
    if isinstance(sockname, tuple) and len(sockname) >= 2:
        host, port = sockname[0], sockname[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(sockname)


def run_linkshell(uplink: str, downlink: str, listen: str, upstream: str) -> int:
    """Run the proxy until Ctrl-C or SIGTERM; return 0 then.

    `uplink`/`downlink` are trace files or bundled trace names (traces.network.bundled_traces).
    Prints one line when listening. A bad trace, address or a port that cannot be bound prints
    one line "layerbatch: ..." on stderr and returns 2.
    """
    try:
        up_trace = resolve_trace(uplink)
        down_trace = resolve_trace(downlink)
        listen_addr = _flag("--listen", listen, any_port=True)
        upstream_addr = _flag("--upstream", upstream, any_port=False)
    except ValueError as exc:
        print(f"layerbatch: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve_until_stopped(up_trace, down_trace, listen_addr, upstream_addr))
    except OSError as exc:
        print(
            f"layerbatch: linkshell cannot listen on {listen}: {_reason(exc)}",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def _flag(flag: str, text: str, *, any_port: bool) -> tuple[str, int]:
    try:
        return parse_hostport(text, any_port=any_port)
    except ValueError as exc:
        raise ValueError(f"{flag} {exc}") from None


async def _serve_until_stopped(
    uplink: LinkTrace, downlink: LinkTrace, listen: tuple[str, int], upstream: tuple[str, int]
) -> None:
    server = await serve_linkshell(uplink, downlink, listen, upstream)
    bound = _address(server.sockets[0].getsockname()) if server.sockets else f"{listen}"
    print(
        f"linkshell: {bound} -> {_address(upstream)}, "
        f"uplink {uplink.name} ({uplink.mean_mbps():.2f} Mbit/s), "
        f"downlink {downlink.name} ({downlink.mean_mbps():.2f} Mbit/s)",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
    try:
        await stop.wait()
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        server.close()

"""The mobile client against a real server on a real socket (client/mobile.py, client/remote.py,
client/fleet.py, `layerbatch client`).

One server for the module: the real app (server/app.py) over the bundled CPU profile of
ResNet-20 (CIFAR-10, real weights), served by aiohttp on a loopback port from a thread of its
own, so that tests can drive it both from their own event loop (MobileClient, run_fleet) and
through the command line in-process (`layerbatch.main`, which runs `asyncio.run` itself).
The client's device runs the same model's real stages on this CPU.

Deadlines are generous (seconds) so that nothing depends on this machine's speed; times are
bounded from below only (what a link or a device must at least take).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import torch
from aiohttp import web

import layerbatch
from client.device import TorchDevice, replay_features
from client.fleet import CAPACITY_ON_TIME, Fleet, SweepPoint, capacity, run_fleet
from client.mobile import FrameRecord, MobileClient, Once, arrivals_ms, summary
from client.remote import PRIOR_MBPS, Remote, mbps_to_bytes_per_ms
from client.source import Frame, load_frames
from layerexec import zoo
from server.app import make_app
from server.runtime import Runtime
from tests.server_cases import CIFAR, build, free_port
from traces.network import PACKET_BYTES, Link, LinkTrace, load_trace

N = 11  # resnet20_cifar10's stages
DEADLINE_MS = 3000.0  # generous: the server on this machine answers in milliseconds
HANG_GUARD_S = 60.0
SUMMARY_KEYS = {
    "requests",
    "on_time_ratio",
    "mean_ms",
    "p99_ms",
    "offloaded_share",
    "bytes_per_frame",
    "fallbacks",
}
RECORD_KEYS = {
    "decision",
    "split",
    "bytes_sent",
    "local_ms",
    "encode_ms",
    "transmit_ms",
    "server_ms",
    "total_ms",
    "on_time",
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --- the server -------------------------------------------------------------------------------


class LiveServer:
    """The app on 127.0.0.1 (any free port), run by an event loop on a thread of its own."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.port = 0
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name="live-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        runner = web.AppRunner(make_app(self.runtime), handler_cancellation=True)
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            self.port = int(runner.addresses[0][1])
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    def __enter__(self) -> LiveServer:
        self._thread.start()
        assert self._ready.wait(HANG_GUARD_S), "the server did not start"
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(HANG_GUARD_S)


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    threads, interval = torch.get_num_threads(), sys.getswitchinterval()
    try:
        with LiveServer(build((CIFAR,))) as live:
            yield live
    finally:
        torch.set_num_threads(threads)
        sys.setswitchinterval(interval)


@pytest.fixture(autouse=True)
def restore_torch_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> zoo.StagedModel:
    return zoo.load_model(CIFAR)


@pytest.fixture(scope="module")
def frames(model: zoo.StagedModel) -> list[Frame]:
    return load_frames("synthetic", model.spec, limit=4, seed=1)


def device_for(
    model: zoo.StagedModel, frames: list[Frame], clock: Any, slowdown: float = 1.0
) -> TorchDevice:
    d = TorchDevice(model, clock, slowdown=slowdown)
    d.calibrate(frames[:1], runs=3)
    return d


def loop_clock() -> Any:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    return lambda: (loop.time() - t0) * 1000.0


def stage_steps(runtime: Runtime, k: int) -> int:
    """How many executor steps have run stage k of the CIFAR model so far."""
    hist = runtime.metrics.batch.get((CIFAR, k))
    return 0 if hist is None else hist.n


# --- MobileClient against the server -------------------------------------------------------------


@pytest.mark.asyncio
async def test_none_sends_jpegs_and_the_server_answers(
    server: LiveServer, model: zoo.StagedModel, frames: list[Frame]
) -> None:
    clock = loop_clock()
    device = device_for(model, frames, clock)
    try:
        async with aiohttp.ClientSession() as session:
            remote = Remote(server.url, CIFAR, session, clock, estimates=[None] * N)
            said: list[str] = []
            client = MobileClient("c", device, remote, "none", DEADLINE_MS, clock, said.append)
            records = await asyncio.wait_for(
                client.run(frames, [0.0, 20.0, 40.0, 60.0]), HANG_GUARD_S
            )
    finally:
        device.close()
    assert said == []
    assert [r.frame for r in records] == [0, 1, 2, 3]
    for r, f in zip(records, frames, strict=True):
        assert (r.decision, r.split, r.status) == ("full", 0, "ok")
        assert r.server_ms > 0
        assert r.bytes_sent > len(f.jpeg)  # the msgpack body carries the JPEG
        assert r.transmit_ms >= 0 and r.local_ms == 0 and r.encode_ms == 0
        assert r.total_ms >= r.server_ms
        assert r.on_time
    assert remote.estimates[0] is not None and remote.estimates[0] > 0
    s = summary(records)
    assert s["requests"] == 4 and s["offloaded_share"] == 1.0 and s["fallbacks"] == 0


@pytest.mark.asyncio
async def test_partial_sends_features_the_server_finishes(
    server: LiveServer, model: zoo.StagedModel, frames: list[Frame]
) -> None:
    """A split at k = 8 made the best option: the device knows its later stages are slow, the
    server will only take the request at stage 8, the uplink is fast. The device runs stages
    0..7 for real, sends the H.264 feature map, and the server runs only stages 8..10."""
    k = 8
    clock = loop_clock()
    device = device_for(model, frames, clock)
    est = device.estimates
    est.stage_ms[k:] = [1000.0] * (N - k)  # local is hopeless: L(N) > 7 s > the deadline
    try:
        async with aiohttp.ClientSession() as session:
            remote = Remote(server.url, CIFAR, session, clock, estimates=[None] * N)
            remote.estimates[k] = 5.0
            remote.throughput.ms_per_byte = 1e-6
            client = MobileClient("c", device, remote, "partial", DEADLINE_MS, clock, print)
            before = (stage_steps(server.runtime, k - 1), stage_steps(server.runtime, k))
            answered = dict(server.runtime.metrics.answered)
            now = clock()
            r = await asyncio.wait_for(client.handle(frames[2], now, now), HANG_GUARD_S)
    finally:
        device.close()
    assert (r.decision, r.split, r.status) == ("partial", k, "ok")
    assert r.server_ms > 0 and r.encode_ms > 0 and r.on_time
    assert r.local_ms >= sum(est.stage_ms[:k]) - 1.0
    assert r.bytes_sent > 0
    # the server ran stage k and the rest for it, never stage k - 1
    after = (stage_steps(server.runtime, k - 1), stage_steps(server.runtime, k))
    assert after[0] == before[0]
    assert after[1] == before[1] + 1
    assert server.runtime.metrics.answered[(CIFAR, "ok")] == answered.get((CIFAR, "ok"), 0) + 1


@pytest.mark.asyncio
async def test_binary_falls_back_locally_when_the_server_is_unreachable(
    model: zoo.StagedModel, frames: list[Frame]
) -> None:
    """Local misses the 1 ms deadline and the (stale) server estimate promises better, so every
    frame is sent; nothing listens on the port, so every frame is finished on the device."""
    clock = loop_clock()
    device = device_for(model, frames, clock, slowdown=10.0)
    said: list[str] = []
    url = f"http://127.0.0.1:{free_port()}"
    try:
        async with aiohttp.ClientSession() as session:
            remote = Remote(url, CIFAR, session, clock, estimates=[1.0])
            remote.throughput.ms_per_byte = 1e-6
            client = MobileClient("c", device, remote, "binary", 1.0, clock, Once(said.append))
            records = await asyncio.wait_for(
                client.run(frames, [0.0, 5.0, 10.0, 15.0, 20.0], refresh=False), HANG_GUARD_S
            )
    finally:
        device.close()
    offloaded = [r for r in records if r.decision != "local"]
    assert len(offloaded) == len(records) == 5
    for r in records:
        assert (r.decision, r.status, r.bytes_sent) == ("full", "fallback", 0)
        assert r.local_ms >= sum(device.estimates.stage_ms) - 1.0  # every stage ran here
        assert r.server_ms == 0
    s = summary(records)
    assert s["fallbacks"] == len(offloaded)
    assert len(said) == 1
    assert url in said[0] and "unreachable" in said[0]


@pytest.mark.asyncio
async def test_mobile_client_itself_says_an_unreachable_server_once(
    model: zoo.StagedModel, frames: list[Frame]
) -> None:
    clock = loop_clock()
    device = device_for(model, frames, clock, slowdown=10.0)
    said: list[str] = []
    try:
        async with aiohttp.ClientSession() as session:
            remote = Remote(f"http://127.0.0.1:{free_port()}", CIFAR, session, clock, None, None)
            remote.estimates[0] = 1.0
            remote.throughput.ms_per_byte = 1e-6
            client = MobileClient("c", device, remote, "binary", 1.0, clock, said.append)
            records = await client.run(frames, [0.0, 5.0, 10.0], refresh=False)
    finally:
        device.close()
    assert [r.status for r in records] == ["fallback"] * 3
    assert len(said) == 1


def least_transmit_ms(trace: LinkTrace, nbytes: int, earliest_ms: float, latest_ms: float) -> float:
    """The least time `nbytes` take on an idle link handed over anywhere in [earliest_ms,
    latest_ms]: delivery - hand-over falls between packet opportunities, so the least lies at an
    opportunity inside the window or at its end."""
    candidates = [latest_ms]
    at = Link(trace).transmit(1, earliest_ms)  # a one-packet message leaves at the opportunity
    while at <= latest_ms:
        candidates.append(at)
        at = Link(trace).transmit(1, at + 1e-3)
    return min(Link(trace).transmit(nbytes, h) - h for h in candidates)


MAHIMAHI_EVERY_10_MS = "".join(f"{t}\n" for t in range(10, 1001, 10))  # 1.2 Mbit/s
# 0.4 Mbit/s. A one-packet JPEG waits for the next opportunity, and frames every 100 ms keep
# one phase against a 10 ms cycle (it can be just before each opportunity: a "fast" link). A
# 30 ms cycle moves the phase by 10 ms a frame, so of any two frames one waits >= ~10 ms.
MAHIMAHI_EVERY_30_MS = "".join(f"{t}\n" for t in range(30, 1001, 30))


@pytest.mark.asyncio
async def test_a_slow_uplink_trace_delays_the_jpegs(
    server: LiveServer, model: zoo.StagedModel, frames: list[Frame], tmp_path: Path
) -> None:
    """One 1500-byte packet every 10 ms: three JPEGs sent at once leave one after the other;
    each transmit time is at least what the trace takes to deliver it."""
    path = tmp_path / "every10ms.up"
    path.write_text(MAHIMAHI_EVERY_10_MS)
    trace = load_trace(path)
    clock = loop_clock()
    device = device_for(model, frames, clock)
    try:
        async with aiohttp.ClientSession() as session:
            link = Link(trace)
            remote = Remote(server.url, CIFAR, session, clock, uplink=link, estimates=[None] * N)
            client = MobileClient("c", device, remote, "none", DEADLINE_MS, clock, print)
            t_start = clock()
            tasks = [asyncio.ensure_future(client.handle(f, t_start, t_start)) for f in frames[:3]]
            while link.busy_until_ms == -math.inf:  # all three are handed to the link by now
                await asyncio.sleep(0)
            handed_by = clock()
            delivered = link.busy_until_ms
            records = await asyncio.wait_for(asyncio.gather(*tasks), HANG_GUARD_S)
    finally:
        device.close()
    assert [r.status for r in records] == ["ok"] * 3
    packets = sum(-(-r.bytes_sent // PACKET_BYTES) for r in records)
    # consecutive opportunities are 10 ms apart: the last packet leaves >= (packets - 1) x 10 ms
    # after the first opportunity the messages could take, which is not before t_start (the
    # moment this test noticed the hand-over, `handed_by`, can be late on a loaded machine)
    assert delivered - t_start >= (packets - 1) * 10.0 - 1e-6
    assert max(r.transmit_ms for r in records) >= delivered - handed_by - 1.0
    # each message was handed over somewhere in [t_start, handed_by] and queued behind others:
    # it takes at least what it would take alone handed over anywhere in that window
    for r in records:
        assert r.transmit_ms >= least_transmit_ms(trace, r.bytes_sent, t_start, handed_by) - 1.0
    # the uplink estimate learnt the trace's pace: well below the 10 Mbit/s prior
    assert remote.throughput.bytes_per_ms < mbps_to_bytes_per_ms(PRIOR_MBPS)


# --- many clients ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_run_fleet_two_clients_against_the_server(
    server: LiveServer, model: zoo.StagedModel, frames: list[Frame]
) -> None:
    d = TorchDevice(model, lambda: 0.0)
    try:
        estimates = d.calibrate(frames[:1], runs=3)
    finally:
        d.close()
    fleet = Fleet(
        server.url,
        CIFAR,
        frames[:2],
        estimates,
        replay_features(model, frames[:2]),
        None,
        None,
        DEADLINE_MS,
        rate_per_client_rps=5.0,
    )
    said: list[str] = []
    records = await asyncio.wait_for(
        run_fleet(fleet, 2, "none", 2.0, np.random.default_rng(7), said.append), HANG_GUARD_S
    )
    assert said == []
    assert {r.client for r in records} == {"client0", "client1"}
    assert all(isinstance(r, FrameRecord) for r in records)
    assert all((r.decision, r.status) == ("full", "ok") for r in records)
    assert all(r.server_ms > 0 and r.arrival_s < 2.0 for r in records)
    assert summary(records)["on_time_ratio"] == 1.0


def record(
    decision: str, status: str, total_ms: float, on_time: bool, bytes_sent: int = 0
) -> FrameRecord:
    split = {"local": N, "full": 0, "partial": 4}[decision]
    return FrameRecord(
        "c", 0, 0.0, decision, split, 1.0, status, bytes_sent, 0.0, 0.0, 0.0, 0.0, total_ms,
        on_time, 10.0,
    )  # fmt: skip


def test_summary_figures_hand_computed() -> None:
    records = [
        record("local", "ok", 10.0, True),
        record("full", "ok", 20.0, True, 1000),
        record("partial", "ok", 30.0, False, 3000),
        record("full", "dropped", 500.0, False, 1000),  # sent; left out of the times
        record("full", "fallback", 40.0, True),  # sent nowhere: finished locally
    ]
    s = summary(records)
    assert s["requests"] == 5
    assert s["on_time_ratio"] == 0.6
    assert s["mean_ms"] == 25.0  # (10 + 20 + 30 + 40) / 4
    assert s["p99_ms"] == pytest.approx(float(np.percentile([10, 20, 30, 40], 99)), abs=0.01)
    assert s["offloaded_share"] == 0.6  # answered by the server (ok or dropped), not fallbacks
    assert s["bytes_per_frame"] == 1000.0
    assert s["fallbacks"] == 1 and s["dropped"] == 1
    assert s["decisions"] == {"local": 1, "full": 3, "partial": 1}


def test_summary_of_no_frames() -> None:
    s = summary([])
    assert s["requests"] == 0 and s["fallbacks"] == 0
    for key in ("on_time_ratio", "mean_ms", "p99_ms", "offloaded_share", "bytes_per_frame"):
        assert s[key] is None


@pytest.mark.parametrize(
    ("duration_s", "fps", "expected"),
    [(0.5, 10.0, [0.0, 100.0, 200.0, 300.0, 400.0]), (1.0, 4.0, [0.0, 250.0, 500.0, 750.0])],
)
def test_constant_arrivals(duration_s: float, fps: float, expected: list[float]) -> None:
    assert arrivals_ms(duration_s, fps, None, np.random.default_rng(0)) == expected


def test_constant_arrivals_stay_inside_the_duration() -> None:
    times = arrivals_ms(2.2, 25.0, None, np.random.default_rng(0))
    assert len(times) == 55
    assert max(times) < 2200.0


def test_poisson_arrivals_are_seeded_and_inside_the_duration() -> None:
    a = arrivals_ms(3.0, None, 20.0, np.random.default_rng(5))
    b = arrivals_ms(3.0, None, 20.0, np.random.default_rng(5))
    assert a == b
    assert a == sorted(a) and all(0 <= t < 3000.0 for t in a)
    assert 20 <= len(a) <= 100  # 60 expected; a seeded draw, far from either bound


def point(mode: str, clients: int, on_time: float | None) -> SweepPoint:
    return SweepPoint(mode, clients, {"on_time_ratio": on_time})


def test_capacity_is_the_largest_n_with_enough_on_time() -> None:
    assert CAPACITY_ON_TIME == 0.9
    points = [
        point("none", 1, 1.0),
        point("none", 2, 0.95),
        point("none", 4, 0.85),
        point("binary", 1, 1.0),
        point("binary", 2, 0.9),  # exactly 0.9 counts
        point("binary", 4, 0.89),
        point("partial", 4, 0.7),
        point("partial", 8, 0.92),  # not monotonic: the largest N that made it
        point("partial", 2, None),  # no requests at all: not a success
    ]
    assert capacity(points, "none") == 2
    assert capacity(points, "binary") == 2
    assert capacity(points, "partial") == 8
    assert capacity(points, "local") == 0  # no points for that mode
    assert capacity([point("none", 3, 0.5)], "none") == 0
    assert capacity([], "none") == 0


# --- the command line, in process ----------------------------------------------------------------


def client_argv(url: str, *extra: str) -> list[str]:
    return [
        "client",
        "--server",
        url,
        "--app",
        CIFAR,
        "--source",
        "synthetic",
        "--frames",
        "3",
        *extra,
    ]


def test_cli_client_json_out_and_plot(
    server: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Five JPEGs through a hand-made uplink trace (drawn under the latency plot)."""
    out, png, up = tmp_path / "run.json", tmp_path / "run.png", tmp_path / "every30ms.up"
    up.write_text(MAHIMAHI_EVERY_30_MS)
    argv = client_argv(
        server.url,
        "--uplink",
        str(up),
        "--offload",
        "none",
        "--fps",
        "10",
        "--duration",
        "0.5",
        "--deadline-ms",
        str(DEADLINE_MS),
        "--json-out",
        str(out),
        "--plot",
        str(png),
    )
    assert layerbatch.main(argv) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    doc = json.loads(out.read_text())
    assert set(doc["summary"]) >= SUMMARY_KEYS
    s = doc["summary"]
    assert s["requests"] == 5 == len(doc["records"])  # 0.5 s at 10 frames/s
    assert s["offloaded_share"] == 1.0 and s["fallbacks"] == 0 and s["on_time_ratio"] == 1.0
    assert s["bytes_per_frame"] > 0 and 0 < s["mean_ms"] <= s["p99_ms"]
    for rec in doc["records"]:
        assert set(rec) >= RECORD_KEYS
        assert (rec["decision"], rec["split"], rec["status"]) == ("full", 0, "ok")
        assert rec["server_ms"] > 0 and rec["bytes_sent"] > 0 and rec["on_time"] is True
        assert rec["transmit_ms"] > 0
    # the uplink estimate learnt the 0.4 Mbit/s trace, from the 10 Mbit/s prior
    assert doc["records"][-1]["uplink_estimate_mbps"] < PRIOR_MBPS
    assert s["bytes_per_frame"] == pytest.approx(
        sum(r["bytes_sent"] for r in doc["records"]) / 5, abs=0.1
    )
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert f"plot: {png}" in captured.out


def test_cli_client_unreachable_server_says_so_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing listens at --server: the first estimate fails, the client says so once (the
    estimates are refreshed every 0.5 s, failing each time), and every frame runs locally."""
    out = tmp_path / "run.json"
    url = f"http://127.0.0.1:{free_port()}"
    argv = client_argv(
        url,
        "--offload",
        "binary",
        "--fps",
        "5",
        "--duration",
        "1.2",
        "--deadline-ms",
        "1",
        "--client-slowdown",
        "5",
        "--json-out",
        str(out),
    )
    assert layerbatch.main(argv) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    unreachable = [line for line in err.splitlines() if "unreachable" in line]
    assert len(unreachable) == 1 and url in unreachable[0]
    doc = json.loads(out.read_text())
    s = doc["summary"]
    assert s["requests"] == 6
    offloaded = sum(r["decision"] != "local" for r in doc["records"])
    assert s["fallbacks"] == offloaded  # an unknown server is not offloaded to at all
    assert all(r["status"] in ("ok", "fallback") for r in doc["records"])


def test_cli_loadgen_refuses_an_app_the_server_does_not_serve(
    server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A load test of an app the server does not serve would measure local fallbacks only."""
    argv = ["loadgen", "--server", server.url, "--app", "mobilenet_v2", "--source", "synthetic",
            "--frames", "2", "--duration", "1", "--clients", "1"]  # fmt: skip
    assert layerbatch.main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"layerbatch loadgen: --app: expected an app the server serves ({CIFAR}), "
        "got mobilenet_v2\n"
    )


def test_cli_loadgen_in_which_no_request_arrives_is_an_error(
    server: LiveServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A load test that sent nothing measured nothing: it printed "requests: 0" and exit 0."""
    out = tmp_path / "run.json"
    argv = ["loadgen", "--server", server.url, "--app", CIFAR, "--source", "synthetic",
            "--frames", "2", "--duration", "1", "--clients", "1", "--rate-per-client", "0.001",
            "--json-out", str(out)]  # fmt: skip
    assert layerbatch.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (
        "layerbatch loadgen: no request arrived within --duration 1 s from --clients 1 at "
        "--rate-per-client 0.001 req/s (Poisson arrivals); raise one of them"
    )
    assert not out.exists()

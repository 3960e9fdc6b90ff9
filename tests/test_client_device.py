"""The client's device (client/device.py): real stages of ResNet-20 (CIFAR-10, real weights) on
this CPU, one piece at a time in FIFO order, held for F x the calibrated stage time.

Times are bounded from below only (what the device must at least take); where a test needs the
device busy it blocks the device thread inside stage 0 with a forward pre-hook (`Gate`) rather
than relying on how fast this machine is. Upper bounds are hang guards.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from client.device import Estimates, ReplayDevice, TorchDevice, replay_features
from client.source import Frame, load_frames
from layerexec import zoo
from layerexec.features import EncodedFeatures, decode_features, encode_features
from layerexec.images import rgb_tensor

CIFAR = "resnet20_cifar10"
N = 11  # resnet20_cifar10's stages
HANG_GUARD_S = 30.0
CLOCK_SLACK_MS = 1.0  # time.sleep and perf_counter granularity, for lower bounds


def clock_ms() -> float:
    return time.perf_counter() * 1000.0


@pytest.fixture(scope="module")
def model() -> zoo.StagedModel:
    return zoo.load_model(CIFAR)


@pytest.fixture(scope="module")
def frames(model: zoo.StagedModel) -> list[Frame]:
    return load_frames("synthetic", model.spec, limit=4, seed=3)


@pytest.fixture(autouse=True)
def restore_torch_threads() -> Iterator[None]:
    """The device thread sets torch's (process-wide) thread count; give it back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def device(model: zoo.StagedModel, frames: list[Frame]) -> Iterator[TorchDevice]:
    d = TorchDevice(model, clock_ms, slowdown=1.0)
    d.calibrate(frames[:2], runs=3)
    yield d
    d.close()


class Gate:
    """Blocks the device thread inside stage 0 of `model` while closed (a forward pre-hook)."""

    def __init__(self, model: zoo.StagedModel) -> None:
        self.entered = threading.Event()
        self._open = threading.Event()
        self._handle = model.stages[0].register_forward_pre_hook(self._hook)

    def _hook(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if not self._open.is_set():
            self.entered.set()
            self._open.wait(HANG_GUARD_S)

    def open(self) -> None:
        self._open.set()

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.open()
        self._handle.remove()


def stage_input(model: zoo.StagedModel, frame: Frame, k: int) -> torch.Tensor:
    """What stage k receives for `frame` (one sample), computed with the model's own stages."""
    out = model.run(rgb_tensor(frame.rgb, model.spec).unsqueeze(0), 0, k)
    assert isinstance(out, torch.Tensor)
    return out[0]


def decoded(f: EncodedFeatures) -> torch.Tensor:
    return decode_features(f.shape, f.scale, f.zero_point, f.codec, f.data)


def assert_close_to_quantised(features: EncodedFeatures, expected: torch.Tensor) -> None:
    """The decoded INT8 map is within one quantisation step of the float map."""
    got = decoded(features)
    assert tuple(got.shape) == tuple(expected.shape)
    assert float((got - expected).abs().max()) <= features.scale * 1.01 + 1e-5


# --- calibration -------------------------------------------------------------------------------


def test_calibrate_measures_every_stage_and_payload(
    model: zoo.StagedModel, frames: list[Frame]
) -> None:
    d = TorchDevice(model, clock_ms)
    try:
        est = d.calibrate(frames[:3], runs=3)
    finally:
        d.close()
    assert d.n_stages == N and d.estimates is est
    assert len(est.stage_ms) == len(est.encode_ms) == len(est.payload_bytes) == N
    assert all(ms > 0 for ms in est.stage_ms)
    # k = 0 sends the camera's JPEG: nothing to encode, its size the mean over the frames given
    assert est.encode_ms[0] == 0.0
    assert est.payload_bytes[0] == round(sum(len(f.jpeg) for f in frames[:3]) / 3)
    # k = 1..N-1: the H.264 feature map of the first frame's stage-k input
    assert all(ms > 0 for ms in est.encode_ms[1:])
    torch.set_num_threads(1)  # as on the device thread
    for k in range(1, N):
        size = len(encode_features(stage_input(model, frames[0], k), k).data)
        assert est.payload_bytes[k] == pytest.approx(size, rel=0.1), k


def test_slowdown_below_one_is_refused(model: zoo.StagedModel) -> None:
    with pytest.raises(ValueError, match=r"slowdown 0\.5.*>= 1"):
        TorchDevice(model, clock_ms, slowdown=0.5)


def test_calibrated_times_include_the_slowdown(model: zoo.StagedModel, frames: list[Frame]) -> None:
    """F multiplies the measured means; both devices are measured on this (noisy) machine, so
    only the order is asserted: at F = 20 every stage is slower than the fastest at F = 1."""
    slow, fast = TorchDevice(model, clock_ms, 20.0), TorchDevice(model, clock_ms, 1.0)
    try:
        s, f = slow.calibrate(frames[:1], runs=3), fast.calibrate(frames[:1], runs=3)
    finally:
        slow.close()
        fast.close()
    assert sum(s.stage_ms) > sum(f.stage_ms)
    # the payloads do not depend on the device's speed
    assert s.payload_bytes == f.payload_bytes


# --- running pieces ----------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("k", [1, 4, 8, N - 1])
async def test_run_to_a_split_returns_the_stage_input_as_features(
    device: TorchDevice, model: zoo.StagedModel, frames: list[Frame], k: int
) -> None:
    piece = await device.run(frames[1], k, predicted_ms=5.0)
    assert piece.split == k
    assert piece.features is not None
    f = piece.features
    assert f.position == k and f.codec == "h264"
    assert tuple(f.shape) == model.in_shapes[k]
    assert_close_to_quantised(f, stage_input(model, frames[1], k))
    assert piece.local_ms >= sum(device.estimates.stage_ms[:k]) - CLOCK_SLACK_MS
    assert piece.encode_ms > 0
    assert piece.wait_ms >= 0


@pytest.mark.asyncio
async def test_run_everything_sends_nothing(
    device: TorchDevice, model: zoo.StagedModel, frames: list[Frame]
) -> None:
    piece = await device.run(frames[0], N, predicted_ms=5.0)
    assert piece.split == N
    assert piece.features is None and piece.encode_ms == 0.0
    assert isinstance(piece.activation, torch.Tensor)
    whole = model.run(rgb_tensor(frames[0].rgb, model.spec).unsqueeze(0))
    assert isinstance(whole, torch.Tensor)
    assert piece.activation.shape == whole.shape == (1, 10)
    assert torch.allclose(piece.activation, whole, atol=1e-4)


@pytest.mark.asyncio
async def test_slowdown_holds_the_device_for_f_times_the_calibrated_time(
    model: zoo.StagedModel, frames: list[Frame]
) -> None:
    d = TorchDevice(model, clock_ms, slowdown=3.0)
    try:
        est = d.calibrate(frames[:1], runs=3)
        for k in (N, 5):
            target_ms = sum(est.stage_ms[:k])  # 3 x the calibrated means
            t0 = clock_ms()
            piece = await d.run(frames[0], k, target_ms)
            elapsed_ms = clock_ms() - t0
            assert piece.local_ms >= target_ms - 1e-9
            assert elapsed_ms >= target_ms - CLOCK_SLACK_MS
            assert elapsed_ms >= piece.local_ms + piece.encode_ms - CLOCK_SLACK_MS
    finally:
        d.close()


@pytest.mark.asyncio
async def test_finish_runs_the_rest_locally(device: TorchDevice, frames: list[Frame]) -> None:
    piece = await device.run(frames[2], 4, predicted_ms=3.0)
    t0 = clock_ms()
    extra_ms = await device.finish(piece)
    elapsed_ms = clock_ms() - t0
    rest_ms = sum(device.estimates.stage_ms[4:])
    assert extra_ms > 0
    assert extra_ms >= rest_ms - 1e-9
    assert elapsed_ms >= rest_ms - CLOCK_SLACK_MS
    assert device.wait_ms() == 0.0


@pytest.mark.asyncio
async def test_pieces_run_one_at_a_time_in_submission_order(
    device: TorchDevice, model: zoo.StagedModel, frames: list[Frame]
) -> None:
    """Three frames submitted at once: before they run, wait_ms() is the sum of their
    predictions (less what the first has already used); each waits behind the ones before."""
    predictions_ms = [200.0, 300.0, 400.0]
    assert device.wait_ms() == 0.0
    with Gate(model) as gate:
        t_before = clock_ms()
        tasks = [
            asyncio.ensure_future(device.run(frames[i], N, p)) for i, p in enumerate(predictions_ms)
        ]
        done = await asyncio.to_thread(gate.entered.wait, HANG_GUARD_S)
        assert done, "the first piece never reached stage 0"
        waiting_ms = device.wait_ms()
        t_check = clock_ms()
        total = sum(predictions_ms)
        assert total - (t_check - t_before) - 1e-6 <= waiting_ms <= total + 1e-6
        await asyncio.sleep(0.05)  # the first piece holds the device a while
        gate.open()
        pieces = await asyncio.wait_for(asyncio.gather(*tasks), HANG_GUARD_S)
    assert [p.split for p in pieces] == [N, N, N]
    waits = [p.wait_ms for p in pieces]
    assert waits[0] < waits[1] < waits[2], waits
    # the second waited at least while the first held the device (gate included), and so on
    assert pieces[0].local_ms >= 50.0 - CLOCK_SLACK_MS
    assert waits[1] >= waits[0] + pieces[0].local_ms - 10.0
    assert waits[2] >= waits[1] + pieces[1].local_ms - 10.0
    assert device.wait_ms() == 0.0


# --- the replayed device -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def replayed(model: zoo.StagedModel, frames: list[Frame]) -> dict[tuple[int, int], Any]:
    threads = torch.get_num_threads()
    try:
        return replay_features(model, frames[:2])
    finally:
        torch.set_num_threads(threads)


def test_replay_features_are_every_split_of_every_frame(
    model: zoo.StagedModel, frames: list[Frame], replayed: dict[tuple[int, int], Any]
) -> None:
    assert set(replayed) == {(f.index, k) for f in frames[:2] for k in range(1, N)}
    for (i, k), f in replayed.items():
        assert f.position == k and tuple(f.shape) == model.in_shapes[k]
        assert_close_to_quantised(f, stage_input(model, frames[i], k))


def replay_estimates() -> Estimates:
    return Estimates([5.0] * N, [0.0] + [1.0] * (N - 1), [1000] + [4000] * (N - 1))


@pytest.mark.asyncio
async def test_replay_device_returns_the_precomputed_features(
    frames: list[Frame], replayed: dict[tuple[int, int], Any]
) -> None:
    loop = asyncio.get_running_loop()
    d = ReplayDevice(replay_estimates(), replayed, 2, lambda: loop.time() * 1000.0)
    assert d.n_stages == N
    # frame 3 of a run maps onto measured frame 3 % 2 = 1
    later = Frame(3, frames[3].rgb, frames[3].jpeg)
    piece = await d.run(later, 4, predicted_ms=21.0)
    assert piece.features is replayed[(1, 4)]
    assert (piece.split, piece.local_ms, piece.encode_ms) == (4, 20.0, 1.0)
    assert piece.activation is None
    whole = await d.run(frames[0], N, predicted_ms=55.0)
    assert whole.features is None and whole.encode_ms == 0.0 and whole.local_ms == 55.0
    assert await d.finish(piece) == 35.0  # stages 4..10 at 5 ms


@pytest.mark.asyncio
async def test_replay_device_serialises_concurrent_pieces(
    frames: list[Frame], replayed: dict[tuple[int, int], Any]
) -> None:
    loop = asyncio.get_running_loop()

    def now_ms() -> float:
        return loop.time() * 1000.0

    d = ReplayDevice(replay_estimates(), replayed, 2, now_ms)
    busy_ms = 4 * 5.0 + 1.0  # stages 0..3 and the encode
    t0 = now_ms()
    first = asyncio.ensure_future(d.run(frames[0], 4, busy_ms))
    second = asyncio.ensure_future(d.run(frames[1], 4, busy_ms))
    await asyncio.sleep(0)  # both submitted, the first holds the device
    waiting_ms = d.wait_ms()  # read before the clock below: at most that much time has passed
    assert 2 * busy_ms - (now_ms() - t0) - 1e-6 <= waiting_ms <= 2 * busy_ms + 1e-6
    a, b = await asyncio.wait_for(asyncio.gather(first, second), HANG_GUARD_S)
    elapsed_ms = now_ms() - t0
    assert a.wait_ms < b.wait_ms
    assert b.wait_ms >= busy_ms - 2.0
    assert elapsed_ms >= 2 * busy_ms - 2.0
    assert d.wait_ms() == 0.0

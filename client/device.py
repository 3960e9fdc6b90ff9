"""The client's own device: it runs the first k stages of a frame and prepares what is sent.

A device is one FIFO: pieces of work run one at a time in the order they were submitted, so a
frame's local time includes waiting behind earlier frames (`wait_ms` predicts it). Two kinds:

- `TorchDevice` runs the stages with torch on its own thread (the model is the server's: same
  definition, same weights, split at the same stage boundaries). A weaker device than this
  machine is modelled by the slowdown F: a piece holds the device for F x the time its stages
  took when calibrated (an idle machine, mean of repeated runs), or for the time it really
  took if that is longer; so a server busy on the same machine does not make the emulated
  device slower than F, while the client still computes every stage. Quantising and H.264 encoding are not
  slowed down (phones and Jetsons encode video in hardware).
- `ReplayDevice` stands in for many simulated clients in one process (paper 003, section 6.5:
  one real client, the others simulated): it holds the device for the times a `TorchDevice`
  measured and sends the feature maps that device computed, so the server still receives real
  H.264 feature maps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from client.source import Frame
from layerexec.features import EncodedFeatures, encode_features
from layerexec.images import rgb_tensor
from layerexec.zoo import StagedModel

_T = TypeVar("_T")


@dataclass(frozen=True)
class Piece:
    """Stages [0, split) of one frame, done: times in ms, the features to send (0 < split < N),
    and the activation (TorchDevice; None on a ReplayDevice) to finish locally if need be."""

    split: int
    wait_ms: float  # behind earlier pieces on the device
    local_ms: float  # the stages, slowdown included
    encode_ms: float
    features: EncodedFeatures | None
    activation: object = None


@dataclass
class Estimates:
    """What the decision needs to know of this device: per-stage time (slowdown included),
    per split k in 0..N-1 the time to prepare the payload and its size (k = 0: the JPEG);
    updated with weight 0.3 from every frame actually sent at k."""

    stage_ms: list[float]
    encode_ms: list[float]
    payload_bytes: list[int]
    weight: float = 0.3

    def observe(self, k: int, encode_ms: float, nbytes: int) -> None:
        w = self.weight
        self.encode_ms[k] = w * encode_ms + (1 - w) * self.encode_ms[k]
        self.payload_bytes[k] = round(w * nbytes + (1 - w) * self.payload_bytes[k])


@dataclass
class _Fifo:
    """The device's queue as the client predicts it: the pieces waiting (their predicted
    durations) and the one running (when it started, its prediction)."""

    clock_ms: Callable[[], float]
    queued_ms: list[float] = field(default_factory=list)
    running: tuple[float, float] | None = None  # (started at, predicted ms)

    def submit(self, predicted_ms: float) -> None:
        self.queued_ms.append(predicted_ms)

    def start(self) -> None:
        self.running = (self.clock_ms(), self.queued_ms.pop(0))

    def done(self) -> None:
        self.running = None

    def wait_ms(self) -> float:
        """Predicted time until the device is free: the running piece's remainder (none once
        it overran its prediction) plus every queued piece."""
        left = 0.0
        if self.running is not None:
            started, predicted = self.running
            left = max(0.0, started + predicted - self.clock_ms())
        return left + sum(self.queued_ms)


class TorchDevice:
    """Stages of `model` on this machine, one piece at a time, slowed by F: with torch on the
    CPU, or (`tensorrt=True`, which needs the tensorrt package and a CUDA GPU) each stage as a
    batch-1 TensorRT engine, any stage that does not end in a tensor staying in torch on the GPU."""

    def __init__(
        self,
        model: StagedModel,
        clock_ms: Callable[[], float],
        slowdown: float = 1.0,
        threads: int = 1,
        tensorrt: bool = False,
    ) -> None:
        if slowdown < 1.0:
            raise ValueError(f"client slowdown {slowdown}: expected a factor >= 1")
        self.model = model
        self.slowdown = slowdown
        self.threads = threads
        self.fifo = _Fifo(clock_ms)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="client-device")
        self.estimates = Estimates([], [], [])
        self.backend = "torch (cpu)"
        self.input_device = "cpu"
        self.stages: list[Callable[[object], object]] = list(model.stages)
        if tensorrt:
            self.stages = _tensorrt_stages(model)
            self.backend, self.input_device = "tensorrt (cuda)", "cuda"

    @property
    def n_stages(self) -> int:
        return len(self.model.stages)

    def wait_ms(self) -> float:
        return self.fifo.wait_ms()

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def calibrate(self, frames: Sequence[Frame], runs: int = 10) -> Estimates:
        """Measure each stage (mean of `runs` batch-1 runs after two warm-ups, times F) and,
        on the first frame, each split's encode time and size (paper: the mean of repeated runs)."""
        return self._pool.submit(self._calibrate, frames, runs).result()

    def _calibrate(self, frames: Sequence[Frame], runs: int) -> Estimates:
        torch.set_num_threads(self.threads)
        n = self.n_stages
        x = rgb_tensor(frames[0].rgb, self.model.spec).unsqueeze(0).to(self.input_device)
        totals = [0.0] * n
        outs: list[object] = []
        with torch.inference_mode():
            for r in range(runs + 2):
                h: object = x
                outs = []
                for k, stage in enumerate(self.stages):
                    t0 = time.perf_counter()
                    h = stage(h)
                    if r >= 2:
                        totals[k] += (time.perf_counter() - t0) * 1000.0
                    outs.append(h)
        stage_ms = [t / runs * self.slowdown for t in totals]
        encode_ms = [0.0] * n
        sizes = [round(sum(len(f.jpeg) for f in frames) / len(frames))] + [0] * (n - 1)
        for k in range(1, n):
            out = outs[k - 1]
            assert isinstance(out, torch.Tensor)
            t0 = time.perf_counter()
            enc = encode_features(out[0], k)
            encode_ms[k] = (time.perf_counter() - t0) * 1000.0
            sizes[k] = len(enc.data)
        self.estimates = Estimates(stage_ms, encode_ms, sizes)
        return self.estimates

    async def run(self, frame: Frame, split: int, predicted_ms: float) -> Piece:
        """Stages [0, split) of `frame`, then (0 < split < N) its features encoded."""
        self.fifo.submit(predicted_ms)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, self._in_turn, self._run, frame, split, time.perf_counter()
        )

    def _in_turn(self, work: Callable[..., _T], *args: object) -> _T:
        """On the device thread: the queue's head becomes the running piece until it is done."""
        torch.set_num_threads(self.threads)
        self.fifo.start()
        try:
            return work(*args)
        finally:
            self.fifo.done()

    def _run(self, frame: Frame, split: int, submitted: float) -> Piece:
        start = time.perf_counter()
        x = rgb_tensor(frame.rgb, self.model.spec).unsqueeze(0).to(self.input_device)
        out = self._stages(x, 0, split)
        local_ms = self._hold(start, 0, split)
        features = None
        encode_ms = 0.0
        if 0 < split < self.n_stages:
            assert isinstance(out, torch.Tensor)
            t0 = time.perf_counter()
            features = encode_features(out[0], split)
            encode_ms = (time.perf_counter() - t0) * 1000.0
        return Piece(split, (start - submitted) * 1000.0, local_ms, encode_ms, features, out)

    async def finish(self, piece: Piece) -> float:
        """Run the stages the server did not ([piece.split, N)) here; returns their ms."""
        self.fifo.submit(sum(self.estimates.stage_ms[piece.split :]))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._in_turn, self._finish, piece)

    def _finish(self, piece: Piece) -> float:
        start = time.perf_counter()
        self._stages(piece.activation, piece.split, self.n_stages)
        return self._hold(start, piece.split, self.n_stages)

    def _stages(self, x: object, k0: int, k1: int) -> object:
        with torch.inference_mode():
            for stage in self.stages[k0:k1]:
                x = stage(x)
        return x

    def _hold(self, start: float, k0: int, k1: int) -> float:
        """Keep the device busy until F x the calibrated time of stages [k0, k1) has passed
        since `start` (module docstring); returns the time held in ms."""
        target_ms = sum(self.estimates.stage_ms[k0:k1])
        took_ms = (time.perf_counter() - start) * 1000.0
        if target_ms > took_ms:
            time.sleep((target_ms - took_ms) / 1000.0)
        return max(took_ms, target_ms)


def _tensorrt_stages(model: StagedModel) -> list[Callable[[object], object]]:
    from layerexec.trt import TensorRTStages, available

    ok, why = available()
    if not ok:
        raise ValueError(f"TensorRT for the client's layers: {why}")
    model.to("cuda")
    out: list[Callable[[object], object]] = []
    for k, stage in enumerate(model.stages):
        try:
            out.append(TensorRTStages(model, k, k + 1, batch=1))  # type: ignore[arg-type]
        except ValueError:  # a stage that does not end in a tensor (a detector's tail)
            out.append(stage)
    return out


@dataclass
class ReplayDevice:
    """A simulated client's device: holds its FIFO for the measured stage times and sends the
    feature maps `features[(frame index, k)]` measured on a real device (see the module doc)."""

    estimates: Estimates
    features: dict[tuple[int, int], EncodedFeatures]
    n_frames: int
    clock_ms: Callable[[], float]
    fifo: _Fifo = field(init=False)
    _lock: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.fifo = _Fifo(self.clock_ms)

    @property
    def n_stages(self) -> int:
        return len(self.estimates.stage_ms)

    def wait_ms(self) -> float:
        return self.fifo.wait_ms()

    async def run(self, frame: Frame, split: int, predicted_ms: float) -> Piece:
        local_ms = sum(self.estimates.stage_ms[:split])
        features = self.features.get((frame.index % self.n_frames, split))
        encode_ms = self.estimates.encode_ms[split] if features is not None else 0.0
        wait = await self._hold(predicted_ms, local_ms + encode_ms)
        return Piece(split, wait, local_ms, encode_ms, features)

    async def finish(self, piece: Piece) -> float:
        rest = sum(self.estimates.stage_ms[piece.split :])
        await self._hold(rest, rest)
        return rest

    async def _hold(self, predicted_ms: float, busy_ms: float) -> float:
        self.fifo.submit(predicted_ms)
        asked = self.clock_ms()
        async with self._lock:
            self.fifo.start()
            try:
                await asyncio.sleep(busy_ms / 1000.0)
            finally:
                self.fifo.done()
        return self.clock_ms() - asked - busy_ms


def replay_features(
    model: StagedModel, frames: Sequence[Frame], threads: int = 1
) -> dict[tuple[int, int], EncodedFeatures]:
    """The H.264 feature maps of each frame at each split 1..N-1 (for ReplayDevice)."""
    torch.set_num_threads(threads)
    out: dict[tuple[int, int], EncodedFeatures] = {}
    with torch.inference_mode():
        for f in frames:
            h: object = rgb_tensor(f.rgb, model.spec).unsqueeze(0)
            for k, stage in enumerate(model.stages[:-1], start=1):
                h = stage(h)
                assert isinstance(h, torch.Tensor)
                out[(f.index, k)] = encode_features(h[0], k)
    return out

"""Measuring a model's `layerbatch.profile/1`: per stage, latency at each batch size.

For each batch size b the whole model runs `runs` times on a seeded random batch (after `warmup`
untimed passes), every stage timed on the previous stage's real output, and each stage's median
is recorded (these machines are noisy; the median resists outliers). Stages are timed in passes,
as the executor runs them, not one stage repeated: a repeated stage finds its weights and input
in cache, which made small batches of mobilenet_v2 look 1.5x faster than a pass through it.
Also recorded per stage: output shape and bytes per sample, and the activation peak per sample
(`memory.peak_activation_bytes`).
The clock is passed in (`timer`, seconds), so this module reads none itself.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from layerexec.memory import nbytes, peak_activation_bytes
from layerexec.zoo import StagedModel

Timer = Callable[[], float]


def _sync(device: torch.device) -> None:
    """Wait for the work queued on the current CUDA stream (only that stream: a model stacked
    beside on a stream of its own is not waited for); nothing on a CPU."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def prepare_input(x: torch.Tensor, device: torch.device, channels_last: bool) -> torch.Tensor:
    """`x` on `device`, in channels-last layout if asked and it is a 4-d batch."""
    x = x.to(device)
    if channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def profile_model(
    model: StagedModel,
    batch_sizes: Sequence[int],
    timer: Timer,
    device: str = "cpu",
    channels_last: bool = True,
    runs: int = 5,
    warmup: int = 2,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    device_name: str = "cpu",
    max_batch: int | None = None,
) -> dict[str, Any]:
    """The profile document of `model` (see the module docstring)."""
    dev = torch.device(device)
    model.to(dev, channels_last)
    gen = torch.Generator().manual_seed(seed)
    latency = [[0.0] * len(batch_sizes) for _ in model.stages]
    out_shape: list[list[int] | None] = [None] * len(model.stages)
    out_bytes = [0] * len(model.stages)
    with torch.inference_mode():
        for j, b in enumerate(batch_sizes):
            x: Any = prepare_input(
                torch.rand(b, *model.spec.input_shape, generator=gen), dev, channels_last
            )
            for _ in range(warmup):
                model.run(x)
            times: list[list[float]] = [[] for _ in model.stages]
            for _ in range(runs):
                y = x
                for k, stage in enumerate(model.stages):
                    _sync(dev)
                    t0 = timer()
                    y = stage(y)
                    _sync(dev)
                    times[k].append((timer() - t0) * 1000.0)
                    if isinstance(y, torch.Tensor):
                        out_shape[k] = list(y.shape[1:])
                    out_bytes[k] = nbytes(y) // b
            for k in range(len(model.stages)):
                latency[k][j] = round(statistics.median(times[k]), 4)
                if progress:
                    progress(1)
    peaks = stage_peaks(model, dev, channels_last, seed)
    stages = [
        {
            "name": name,
            "latency_ms": latency[k],
            "out_shape": out_shape[k],
            "out_bytes": out_bytes[k],
            "peak_bytes": peaks[k],
        }
        for k, name in enumerate(model.names)
    ]
    return {
        "format": "layerbatch.profile/1",
        "model": model.name,
        "device": device_name,
        "input": {"shape": list(model.spec.input_shape), "dtype": "float32"},
        "batch_sizes": list(batch_sizes),
        "stages": stages,
        "max_batch": max_batch if max_batch is not None else max(batch_sizes),
        "layout": "channels_last" if channels_last else "contiguous",
        "weights": model.spec.weights,
        "batch_norm": "folded" if model.batch_norm_folded else "as defined",
    }


def stage_peaks(
    model: StagedModel, device: torch.device, channels_last: bool, seed: int
) -> list[int]:
    """Activation peak per sample of every stage, measured at batch 2."""
    gen = torch.Generator().manual_seed(seed)
    x: Any = prepare_input(
        torch.rand(2, *model.spec.input_shape, generator=gen), device, channels_last
    )
    peaks = []
    for stage in model.stages:
        peak, x = peak_activation_bytes(stage, x)
        peaks.append(peak // 2)
    return peaks


def max_abs_difference(model: StagedModel, batch: int = 2, seed: int = 0) -> float:
    """Largest |split - whole| over the outputs, on one seeded batch (for --verify)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(batch, *model.spec.input_shape, generator=gen)
    with torch.inference_mode():
        whole = model.module(list(x)) if model.spec.kind == "detector" else model.module(x)
    return _max_diff(whole, model.run(x))


def _max_diff(a: Any, b: Any) -> float:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            return float("inf")
        return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        return max((_max_diff(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return max((_max_diff(a[k], b[k]) for k in a), default=0.0)
    return float("inf")


def stacking_slowdown(
    a: StagedModel,
    b: StagedModel,
    timer: Timer,
    batch: int = 1,
    runs: int = 5,
    seed: int = 0,
    device: str = "cpu",
    channels_last: bool = False,
) -> float:
    """How much longer a whole forward of `a` takes while `b` runs forwards in another thread
    (paper 002 section 2.2): median with b / median alone. Both models are moved to `device`
    (in place). On a CPU the two threads share the intra-op threads; on a GPU each runs on a
    CUDA stream of its own, as the executor stacks them (`Executor.run_stacked`)."""
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    xa = prepare_input(torch.rand(batch, *a.spec.input_shape, generator=gen), dev, channels_last)
    xb = prepare_input(torch.rand(batch, *b.spec.input_shape, generator=gen), dev, channels_last)
    a.to(dev, channels_last)
    b.to(dev, channels_last)

    def time_a() -> float:
        times = []
        for _ in range(runs):
            _sync(dev)
            t0 = timer()
            a.run(xa)
            _sync(dev)
            times.append(timer() - t0)
        return statistics.median(times)

    a.run(xa)
    alone = time_a()
    stop = threading.Event()

    def loop_b() -> None:
        with _own_stream(dev):
            while not stop.is_set():
                b.run(xb)
                _sync(dev)

    other = threading.Thread(target=loop_b, daemon=True)
    other.start()
    try:
        together = time_a()
    finally:
        stop.set()
        other.join()
    return round(together / alone, 3)


def _own_stream(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """A new CUDA stream made current on a GPU; nothing on a CPU."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.Stream(device))

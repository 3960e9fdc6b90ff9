"""layerexec's smaller parts: activation memory and the batch bound, INT8 feature maps, the
TensorRT backend (skipped without it), the profiler with a fake clock, the `profile` and
`models` verbs, the shipped CPU profiles, and an image as a model's input."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
import torch.fx as fx
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import layerbatch
from layerexec import trt, zoo
from layerexec.images import rgb_tensor
from layerexec.memory import batch_bound, nbytes, peak_activation_bytes
from layerexec.profiler import max_abs_difference, profile_model, stacking_slowdown
from layerexec.quant import dequantise, quantise
from scheduler import Deployment
from scheduler.profile import load_profile, parse_profile
from tests.exec_cases import Residual, batch, staged, staged_from

F32 = 4  # bytes


# --- memory ------------------------------------------------------------------------------------
class _Widening(nn.Module):
    """x (4) -> a = cat(x, x) (8) -> b = a + 1 (8) -> c = cat(b, b) (16) -> out = c * 2 (16),
    floats per sample. Freed after last use, the most alive at once is c and out: 32 floats;
    nothing freed would be 4 + 8 + 8 + 16 + 16 = 52."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.cat([x, x], 1)
        b = a + 1
        c = torch.cat([b, b], 1)
        return c * 2


class _Skip(nn.Module):
    """x (4) -> a = cat(x, x) (8) -> b = a * 3 (8) -> out = b[:, :4] + x. The input is alive until
    the end: at b, x + a + b = 20 floats are alive at once (then a goes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.cat([x, x], 1)
        b = a * 3
        return b[:, :4] + x


@pytest.mark.parametrize(("module", "floats"), [(_Widening(), 32), (_Skip(), 20)])
@pytest.mark.parametrize("size", [1, 3])
def test_peak_activation_bytes_counts_what_is_alive_at_once(
    module: nn.Module, floats: int, size: int
) -> None:
    stage = fx.symbolic_trace(module)
    x = torch.rand(size, 4)
    peak, out = peak_activation_bytes(stage, x)
    assert peak == floats * F32 * size
    torch.testing.assert_close(out, module(x))


def test_a_stage_that_is_not_an_fx_graph_counts_its_input_and_output() -> None:
    x = torch.rand(2, 4)
    peak, out = peak_activation_bytes(_Widening(), x)
    assert peak == (4 + 16) * F32 * 2
    assert out.shape == (2, 16)


def test_nbytes_of_nested_values() -> None:
    t = torch.zeros(2, 3)  # 24 bytes
    u8 = torch.zeros(5, dtype=torch.uint8)
    assert nbytes(t) == 24 and nbytes(u8) == 5
    assert nbytes([t, {"a": u8, "b": (t, 7)}, "text"]) == 24 + 5 + 24
    assert nbytes(None) == 0


def test_batch_bound_is_the_largest_batch_whose_worst_peak_fits() -> None:
    peaks = [100, 300, 200]
    assert batch_bound(peaks, 1000, cap=8) == 3  # 3 * 300 <= 1000 < 4 * 300
    assert batch_bound(peaks, 1200, cap=8) == 4  # exactly fits
    assert batch_bound(peaks, 1199, cap=8) == 3
    assert batch_bound(peaks, 10**9, cap=8) == 8  # capped
    assert batch_bound(peaks, 299, cap=8) == 0  # not even one
    assert batch_bound([], 10, cap=5) == 5


@given(
    peaks=st.lists(st.integers(1, 10**6), min_size=1, max_size=6),
    budget=st.integers(0, 10**8),
    cap=st.integers(1, 64),
)
@settings(max_examples=200, deadline=None)
def test_batch_bound_fits_and_one_more_would_not(peaks: list[int], budget: int, cap: int) -> None:
    b = batch_bound(peaks, budget, cap)
    assert 0 <= b <= cap
    assert b * max(peaks) <= budget
    assert b == cap or (b + 1) * max(peaks) > budget


# --- INT8 feature maps ----------------------------------------------------------------------------
_KINDS = ["mixed", "positive", "negative", "constant", "zeros", "with-zeros"]


def _tensor(kind: str, seed: int, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 5, 6, generator=g) * scale
    if kind == "positive":
        return x.abs() + scale * 0.1
    if kind == "negative":
        return -x.abs() - scale * 0.1
    if kind == "constant":
        return torch.full((4, 5, 6), float(x[0, 0, 0]))
    if kind == "zeros":
        return torch.zeros(4, 5, 6)
    if kind == "with-zeros":
        return x * (torch.rand(4, 5, 6, generator=g) > 0.5)
    return x


@given(
    kind=st.sampled_from(_KINDS),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([1e-4, 1.0, 37.0, 1e5]),
)
@settings(max_examples=150, deadline=None)
def test_quantise_round_trip_is_within_half_a_step(kind: str, seed: int, scale: float) -> None:
    x = _tensor(kind, seed, scale)
    q = quantise(x)
    assert q.data.dtype == torch.uint8 and q.data.shape == x.shape
    assert 0 <= q.zero_point <= 255 and q.scale > 0
    back = dequantise(q)
    assert back.dtype == torch.float32 and back.shape == x.shape
    # scale / 2 from rounding, plus float32 rounding of values up to 255 steps
    slack = q.scale / 2 + 4 * torch.finfo(torch.float32).eps * float(x.abs().max())
    assert float((back - x).abs().max()) <= slack
    assert bool((back[x == 0] == 0).all())  # zero maps exactly to zero
    if kind in ("zeros", "constant"):
        torch.testing.assert_close(back, x, rtol=1e-6, atol=0)
    if kind == "zeros":
        assert torch.equal(back, x)


def test_quantise_uses_the_whole_range_including_zero() -> None:
    q = quantise(torch.tensor([-1.0, 0.0, 3.0]))
    assert q.scale == pytest.approx(4.0 / 255)
    assert q.data.tolist() == [0, q.zero_point, 255]
    assert q.zero_point == round(1.0 / (4.0 / 255))
    neg = quantise(torch.tensor([-2.0, -1.0]))  # range [-2, 0]
    assert neg.zero_point == 255 and neg.data.tolist() == [0, 128]
    assert dequantise(q, torch.float64).dtype == torch.float64


# --- TensorRT --------------------------------------------------------------------------------------
def test_tensorrt_says_why_it_is_unavailable() -> None:
    ok, why = trt.available()
    if ok:
        assert why == ""
        return
    assert why and ("tensorrt" in why.lower() or "cuda" in why.lower())
    with pytest.raises(RuntimeError, match=re.escape(why)):
        trt.TensorRTStages(staged("resnet20_cifar10"), 0, 2, batch=1)


def test_tensorrt_engine_matches_the_stages_it_replaces() -> None:
    ok, why = trt.available()
    if not ok:
        pytest.skip(why)
    model = staged("resnet20_cifar10")
    engine = trt.TensorRTStages(model, 0, 3, batch=2)
    x = batch(model.spec.input_shape, 2, 0).cuda()
    model.to("cuda")
    try:
        want = model.run(x, 0, 3)
        assert isinstance(want, torch.Tensor)
        torch.testing.assert_close(engine(x), want, rtol=1e-3, atol=1e-3)
    finally:
        model.to("cpu")


# --- profiler with a fake clock ----------------------------------------------------------------------
class FakeClock:
    """Every read advances the clock by `step_s`: a timed call between two reads always lasts
    exactly `step_s`, so the medians are known in advance."""

    def __init__(self, step_s: float) -> None:
        self.now = 0.0
        self.step_s = step_s
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        self.now += self.step_s
        return self.now


def test_profile_model_with_a_fake_clock_gives_exact_latencies_and_shapes() -> None:
    model = staged_from("residual", Residual, (3, 8, 8))
    clock = FakeClock(0.125)
    doc = profile_model(model, [1, 2], clock, channels_last=False, runs=3, warmup=1)
    n = len(model.stages)
    assert clock.reads == 2 * 3 * n * 2  # two reads per timed run
    for stage in doc["stages"]:
        assert stage["latency_ms"] == [125.0, 125.0]
        assert stage["peak_bytes"] > 0
    assert [s["out_shape"] for s in doc["stages"]][-1] == [4, 8, 8]
    assert doc["stages"][-1]["out_bytes"] == 4 * 8 * 8 * F32
    for k in range(n - 1):
        assert doc["stages"][k]["out_shape"] == list(model.in_shapes[k + 1])
    assert doc["max_batch"] == 2 and doc["batch_sizes"] == [1, 2]
    parsed = parse_profile(doc, "residual.json")
    assert parsed.num_stages == n


class Logged(nn.Module):
    """A stage that notes its index in `log` when it runs."""

    def __init__(self, inner: nn.Module, index: int, log: list[int]) -> None:
        super().__init__()
        self.inner, self.index, self.log = inner, index, log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append(self.index)
        out: torch.Tensor = self.inner(x)
        return out


def test_profile_model_times_stages_in_passes_not_one_stage_repeated() -> None:
    """A clock that charges 1 ms for a stage run right after itself (its weights still in
    cache) and 3 ms otherwise: timed in passes through the model, as the executor runs it,
    every stage measures 3 ms."""
    base = staged_from("residual", Residual, (3, 8, 8))
    log: list[int] = []
    stages = tuple(Logged(stage, k, log) for k, stage in enumerate(base.stages))
    model = dataclasses.replace(base, stages=stages)
    assert len(stages) >= 2

    class CacheClock:
        def __init__(self) -> None:
            self.now, self.start = 0.0, True

        def __call__(self) -> float:
            if not self.start:  # the end of a timed call: the stage that just ran is log[-1]
                self.now += 0.001 if len(log) >= 2 and log[-2] == log[-1] else 0.003
            self.start = not self.start
            return self.now

    doc = profile_model(model, [1, 2], CacheClock(), channels_last=False, runs=3, warmup=1)
    for stage in doc["stages"]:
        assert stage["latency_ms"] == pytest.approx([3.0, 3.0])


def test_stacking_slowdown_is_together_over_alone() -> None:
    a = staged_from("a", Residual, (3, 8, 8))
    b = staged_from("b", Residual, (3, 8, 8), seed=1)
    durations = iter([1.0] * 3 + [1.5] * 3)  # alone, then together (seconds per run)

    class Clock:
        def __init__(self) -> None:
            self.t = 0.0
            self.start = True

        def __call__(self) -> float:
            if not self.start:
                self.t += next(durations)
            self.start = not self.start
            return self.t

    assert stacking_slowdown(a, b, Clock(), runs=3) == 1.5


def test_max_abs_difference_is_zero_for_a_split_model() -> None:
    assert max_abs_difference(staged("resnet18")) == 0.0


# --- the `models` and `profile` verbs -------------------------------------------------------------
def _profile_cli(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "profile", "--model", "resnet20_cifar10", "--batch-sizes", "1,2", "--runs", "1",
        "--warmup", "0", "--threads", "1", "--out", str(tmp_path / "p.json"), *extra,
    ]  # fmt: skip


def test_models_verb_lists_every_zoo_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert layerbatch.main(["models"]) == 0
    out = capsys.readouterr().out
    for name in zoo.MODELS:
        assert name in out


def test_profile_verb_writes_a_profile_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert layerbatch.main(_profile_cli(tmp_path, "--verify")) == 0
    out = capsys.readouterr().out
    assert "largest |split - whole| = 0" in out
    p = load_profile(tmp_path / "p.json")
    assert p.model == "resnet20_cifar10" and p.batch_sizes == (1, 2)
    assert p.num_stages == len(staged("resnet20_cifar10").stages)


def test_profile_verb_derives_max_batch_from_a_memory_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert layerbatch.main(_profile_cli(tmp_path, "--memory-mb", "1")) == 0
    raw = json.loads((tmp_path / "p.json").read_text())
    peaks = [s["peak_bytes"] for s in raw["stages"]]
    assert raw["max_batch"] == batch_bound(peaks, 2**20, cap=2)


def test_profile_verb_output_with_every_key_it_writes_loads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The loader refuses keys it does not know; those `layerbatch profile` writes beside the
    format's (layout, weights, batch_norm, memory_budget_mb, stacking's batch) it knows."""
    extra = ("--memory-mb", "64", "--stack-with", "resnet20_cifar10")
    assert layerbatch.main(_profile_cli(tmp_path, *extra)) == 0
    raw = json.loads((tmp_path / "p.json").read_text())
    assert {"layout", "weights", "batch_norm", "memory_budget_mb"} <= set(raw)
    assert set(raw["stacking"]["resnet20_cifar10"]) == {"batch", "slowdown"}
    p = load_profile(tmp_path / "p.json")
    assert set(p.stacking_slowdown) == {"resnet20_cifar10"}


def test_profile_verb_with_an_unknown_model_lists_the_known_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _profile_cli(tmp_path)
    args[args.index("resnet20_cifar10")] = "nosuch"
    assert layerbatch.main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert "nosuch" in lines[0] and all(name in lines[0] for name in zoo.MODELS)
    assert not (tmp_path / "p.json").exists()


def test_profile_verb_with_an_unknown_stack_model_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert layerbatch.main(_profile_cli(tmp_path, "--stack-with", "nosuch")) == 2
    err = capsys.readouterr().err
    assert "--stack-with" in err and "nosuch" in err


def test_profile_verb_with_a_budget_too_small_for_one_sample_names_the_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert layerbatch.main(_profile_cli(tmp_path, "--memory-mb", "0.01")) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--memory-mb" in err
    assert not (tmp_path / "p.json").exists()


# --- shipped CPU profiles -----------------------------------------------------------------------------
SHIPPED_CPU = sorted((layerbatch.BUNDLED_PROFILES).glob("*-cpu.json"))


def test_a_cpu_profile_is_shipped_for_every_zoo_model() -> None:
    shipped = {load_profile(f).model for f in SHIPPED_CPU}
    assert shipped == set(zoo.MODELS)


@pytest.mark.parametrize("path", SHIPPED_CPU, ids=lambda p: p.name)
def test_shipped_cpu_profile_matches_the_zoo_model(path: Path) -> None:
    from layerexec.executor import Executor

    p = load_profile(path)
    m = staged(p.model)
    assert p.num_stages == len(m.stages)
    assert [s.name for s in p.stages] == list(m.names)
    assert p.input_shape == m.spec.input_shape
    for k in range(p.num_stages - 1):
        assert p.stages[k].out_shape == m.in_shapes[k + 1]
    raw: dict[str, Any] = json.loads(path.read_text())
    assert all(s.get("peak_bytes", 0) > 0 for s in raw["stages"])
    # measured on the model as the server loads it (batch norms folded, except the detector's)
    assert raw["batch_norm"] == ("folded" if m.batch_norm_folded else "as defined")
    Executor(Deployment([p]), {p.model: m})  # the executor accepts it


# --- image input ---------------------------------------------------------------------------------
@settings(max_examples=20, deadline=None)
@given(
    model=st.sampled_from(["mobilenet_v2", "resnet20_cifar10", "ultraface_slim320"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_rgb_tensor_is_the_per_channel_normalisation_in_float32(model: str, seed: int) -> None:
    """(pixel - mean[c]) * (1 / std[c]) in float32, exactly; (C, H, W) viewed over channels-last
    memory; resized to the model's input first."""
    spec = zoo.spec(model)
    _, h, w = spec.input_shape
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    mean = np.asarray(spec.pixel_mean, dtype=np.float32)
    inv_std = np.float32(1.0) / np.asarray(spec.pixel_std, dtype=np.float32)
    expected = (rgb.astype(np.float32) - mean) * inv_std
    out = rgb_tensor(rgb, spec)
    assert out.dtype == torch.float32 and tuple(out.shape) == (3, h, w)
    assert out.permute(1, 2, 0).is_contiguous()
    assert torch.equal(out.permute(1, 2, 0), torch.from_numpy(expected))
    bigger = cv2.resize(rgb, (2 * w, 2 * h), interpolation=cv2.INTER_LINEAR)
    assert tuple(rgb_tensor(bigger, spec).shape) == (3, h, w)

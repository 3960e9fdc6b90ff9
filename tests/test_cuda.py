"""The CUDA paths, on a machine with a GPU (skipped elsewhere): the executor runs plans on the
GPU and gives the whole model's results, stacking runs two models on streams of their own, and
`layerbatch profile --device cuda` measures a profile (stacking slowdowns too) that reads back.

On a GPU convolutions may use TF32, so results are compared with the CPU's within a tolerance,
and classifiers must agree on the top class."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import layerbatch
from layerexec import zoo
from layerexec.executor import Executor
from layerexec.profiler import profile_model, stacking_slowdown
from scheduler import Deployment
from scheduler.profile import load_profile, parse_profile
from scheduler.types import Action
from tests.exec_cases import batch, profile_for, row, whole

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _on_gpu(name: str) -> tuple[zoo.StagedModel, zoo.StagedModel]:
    """(the model on the CPU, a copy of it the executor may move to the GPU)."""
    return zoo.load_model(name), zoo.load_model(name)


def _close_to(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), want, rtol=2e-2, atol=2e-2)
    assert int(got.argmax()) == int(want.argmax())


def _executor(models: dict[str, zoo.StagedModel], channels_last: bool) -> Executor:
    profiles = [profile_for(n, len(m.stages), m.spec.input_shape) for n, m in models.items()]
    return Executor(Deployment(profiles), models, device="cuda", channels_last=channels_last)


@pytest.mark.parametrize("channels_last", [False, True])
def test_executor_on_cuda_gives_each_request_the_whole_models_result(channels_last: bool) -> None:
    cpu, gpu = _on_gpu("mobilenet_v2")
    ex = _executor({gpu.name: gpu}, channels_last)
    xs = batch(cpu.spec.input_shape, 3, seed=1)
    ids = [f"r{i}" for i in range(3)]
    for rid, x in zip(ids, xs, strict=True):
        ex.admit(rid, gpu.name, 0, x.clone())
    n = len(gpu.stages)
    # two at stage 0 run the first half together, the third catches up, then all three finish
    assert ex.run(Action(gpu.name, (0, n // 2), tuple(ids[:2]))).stages_done == n // 2
    assert ex.run(Action(gpu.name, (0, n // 2), (ids[2],))).stages_done == n // 2
    done = ex.run(Action(gpu.name, (n // 2, n), tuple(ids)))
    assert set(done.finished) == set(ids) and len(ex.store) == 0
    want = whole(cpu, xs)
    for i, rid in enumerate(ids):
        _close_to(done.finished[rid], row(want, i))


def test_stacked_actions_run_on_cuda_streams_and_both_are_right() -> None:
    (a_cpu, a), (b_cpu, b) = _on_gpu("resnet18"), _on_gpu("googlenet")
    ex = _executor({a.name: a, b.name: b}, channels_last=True)
    xa, xb = batch(a.spec.input_shape, 2, seed=2), batch(b.spec.input_shape, 2, seed=3)
    for i in range(2):
        ex.admit(f"a{i}", a.name, 0, xa[i].clone())
        ex.admit(f"b{i}", b.name, 0, xb[i].clone())
    try:
        pa, pb = ex.run_stacked(
            Action(a.name, (0, len(a.stages)), ("a0", "a1")),
            Action(b.name, (0, len(b.stages)), ("b0", "b1")),
        )
    finally:
        ex.close()
    assert not pa.cancelled and not pb.cancelled
    for prefix, progress, model, x in (("a", pa, a_cpu, xa), ("b", pb, b_cpu, xb)):
        want: Any = whole(model, x)
        for i in range(2):
            _close_to(progress.finished[f"{prefix}{i}"], row(want, i))


def test_a_profile_measured_on_cuda_reads_back() -> None:
    model = zoo.load_model("resnet20_cifar10")
    doc = profile_model(model, [1, 4], time.perf_counter, device="cuda", runs=3, warmup=1,
                        device_name=torch.cuda.get_device_name(0))  # fmt: skip
    profile = parse_profile(doc, "cuda profile")
    assert profile.batch_sizes == (1, 4) and profile.num_stages == len(model.stages)
    assert all(ms > 0 for s in profile.stages for ms in s.latency_ms)
    assert all(s.peak_bytes > 0 for s in profile.stages)


def test_stacking_slowdown_on_cuda_is_measured_on_the_gpu() -> None:
    a, b = zoo.load_model("resnet20_cifar10"), zoo.load_model("mobilenet_v2")
    slowdown = stacking_slowdown(a, b, time.perf_counter, runs=5, device="cuda")
    assert next(a.module.parameters()).is_cuda and next(b.module.parameters()).is_cuda
    assert 0.5 < slowdown < 20


def test_profile_verb_on_cuda_with_stacking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    argv = [
        "profile", "--model", "resnet20_cifar10", "--device", "cuda", "--batch-sizes", "1,2",
        "--runs", "2", "--warmup", "1", "--stack-with", "mobilenet_v2", "--verify",
        "--out", str(out),
    ]  # fmt: skip
    assert layerbatch.main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    raw = json.loads(out.read_text())
    assert raw["device"] == torch.cuda.get_device_name(0)
    assert raw["stacking"]["mobilenet_v2"]["slowdown"] > 0
    assert load_profile(out).model == "resnet20_cifar10"

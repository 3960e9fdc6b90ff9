"""Stages compiled to TorchScript, so that a stage runs without the GIL (`script_stages`).

An eager stage returns to Python between every two torch ops and takes the GIL back each
time; on a server whose event loop (parsing requests, planning) holds the GIL for a good part
of a burst, every one of those re-takes waits for the loop, and a one-thread lane's small steps
slow down (two resnet18 lanes at batch 1 beside a loop holding the GIL 60% of the time: 1.13x
the requests a second scripted, `bench/script_stages.py`).
A traced and frozen stage runs all its ops in C++ with the GIL released, and takes it back once.
On the server the loop holds the GIL far less than that: 0.008 more on time over 16 pairs of
runs on two replicas (`bench/results/peers-log.md`, session 55).

Each stage is traced on a batch of two in the layout it will run in, frozen (weights inlined as
constants), and kept only if it computes what the eager stage does on a batch of three (so no
batch size was baked in); a stage that cannot be traced, or does not map a tensor to a tensor,
stays eager. The result is the same function up to float rounding.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch
from torch import nn

from layerexec.profiler import prepare_input
from layerexec.zoo import StagedModel

TOLERANCE = 1e-4  # max |scripted - eager|, relative to the eager output's max magnitude


def script_stages(model: StagedModel, channels_last: bool = False) -> StagedModel:
    """`model` with each stage that traces faithfully replaced by its frozen TorchScript (module
    docstring), for inputs in `channels_last` layout (4-d) on the device its weights are on.
    `model` is moved to that layout first (as the executor would) and keeps its eager stages;
    the frozen stages hold their own copy of the weights."""
    device = next(iter(model.module.parameters()), torch.zeros(0)).device
    model.to(device, channels_last)
    stages = tuple(
        _scripted(stage, shape, device, channels_last)
        for stage, shape in zip(model.stages, model.in_shapes, strict=True)
    )
    return dataclasses.replace(model, stages=stages)


def scripted_count(model: StagedModel) -> int:
    """How many of `model`'s stages run as TorchScript."""
    return sum(isinstance(s, torch.jit.ScriptModule) for s in model.stages)


def _scripted(
    stage: nn.Module, shape: tuple[int, ...], device: torch.device, channels_last: bool
) -> nn.Module:
    def example(n: int) -> torch.Tensor:
        x = torch.rand(n, *shape, generator=torch.Generator().manual_seed(n))
        return prepare_input(x, device, channels_last)

    x2, x3 = example(2), example(3)
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # jit.trace is deprecated in favour of torch.compile
            want = stage(x3)
            if not isinstance(want, torch.Tensor):
                return stage
            traced = torch.jit.freeze(torch.jit.trace(stage.eval(), x2, check_trace=False))
            got = traced(x3)
    except Exception:  # tracing fails in many ways; the stage then simply stays eager
        return stage
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return stage
    scale = float(want.abs().max()) or 1.0
    return traced if float((got - want).abs().max()) <= TOLERANCE * scale else stage

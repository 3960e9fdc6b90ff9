"""Shared builders and checkers for the layerexec tests (split, executor, profiler, CLI).

Zoo models are loaded once per test session (`staged`, an lru_cache): splitting vgg16 or
fcn_resnet50 takes seconds on this machine. Tests must not change a cached model in place
(`StagedModel.to(..., channels_last=True)`, `profile_model` with channels_last): those load a
fresh copy with `zoo.load_model`.

The reference a stage-wise result is compared with is always the *whole* module (`whole`), run
directly, never through the stages.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from layerexec import zoo
from layerexec.executor import Executor
from layerexec.split import Policy, split_model
from layerexec.zoo import ModelSpec, StagedModel
from scheduler import App, Deployment, parse_profile
from scheduler.profile import Profile

# The models the brief calls small enough for property tests through the executor.
SMALL = (
    "resnet18",
    "mobilenet_v2",
    "googlenet",
    "ssdlite320_mobilenet_v3_large",
    "resnet20_cifar10",
)


# --- models ---------------------------------------------------------------------------------
@functools.cache
def staged(name: str) -> StagedModel:
    """The zoo model `name`, loaded (and split) once per session. Do not modify it."""
    return zoo.load_model(name)


def batch(shape: Sequence[int], n: int, seed: int) -> torch.Tensor:
    """A seeded batch of `n` samples in [0, 1) (the detectors expect images in [0, 1])."""
    return torch.rand(n, *shape, generator=torch.Generator().manual_seed(seed))


def whole(model: StagedModel, x: torch.Tensor) -> Any:
    """The whole module (not its stages) on the batch `x`; a detector gets a list of images."""
    with torch.inference_mode():
        if model.spec.kind == "detector":
            return model.module(list(x))
        return model.module(x)


def row(out: Any, i: int) -> Any:
    """Sample i of a batch output: a tensor's row, a detector's i-th image, a dict's or a tuple of
    batch tensors' rows."""
    if isinstance(out, torch.Tensor):
        return out[i]
    if isinstance(out, dict):
        return {k: row(v, i) for k, v in out.items()}
    if isinstance(out, list):  # detector: one dict per image
        return out[i]
    if isinstance(out, tuple):
        return tuple(row(v, i) for v in out)
    raise TypeError(type(out).__name__)


def assert_same(got: Any, want: Any, exact: bool = False) -> None:
    """Recursive comparison of tensors, lists, tuples and dicts of them. `exact`: bit-identical;
    otherwise `torch.testing.assert_close` with its default tolerances."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"expected a tensor, got {type(got).__name__}"
        if exact:
            assert got.shape == want.shape and got.dtype == want.dtype
            assert torch.equal(got, want), f"max |diff| {(got - want).abs().max().item()}"
        else:
            torch.testing.assert_close(got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys()
        for k in want:
            assert_same(got[k], want[k], exact)
    elif isinstance(want, list | tuple):
        assert isinstance(got, list | tuple) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w, exact)
    else:
        raise TypeError(f"cannot compare values of type {type(want).__name__}")


# --- hand-made fx-traceable modules -----------------------------------------------------------
class Residual(nn.Module):
    """stem conv -> relu -> [c1 -> relu -> c2, + skip] -> relu -> head conv. 3x8x8 -> 4x8x8."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.c1 = nn.Conv2d(8, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        y = self.c2(F.relu(self.c1(x)))
        return self.head(F.relu(x + y))


class ResizeBack(nn.Module):
    """A segmenter in miniature: convs at half resolution, resized back to the input's size with
    `F.interpolate(y, size=x.shape[-2:])` (as torchvision's FCN does). 3x8x8 -> 2x8x8."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, 3, padding=1)
        self.c2 = nn.Conv2d(6, 6, 3, padding=1)
        self.c3 = nn.Conv2d(6, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[-2:]
        y = F.max_pool2d(F.relu(self.c1(x)), 2)
        y = F.relu(self.c2(y))
        y = self.c3(y)
        return F.interpolate(y, size=size, mode="bilinear", align_corners=False)


class Classifier(nn.Module):
    """4x8x8 features -> 5 scores (conv, pool, flatten, linear)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(4, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(F.relu(self.c1(x)), 2)
        return self.fc(torch.flatten(y, 1))


def staged_from(
    name: str,
    build: Callable[[], nn.Module],
    input_shape: tuple[int, ...],
    seed: int = 0,
    policy: Policy | None = None,
) -> StagedModel:
    """A StagedModel made the way the zoo makes one, from a module of our own."""
    torch.manual_seed(seed)
    module = build().eval()
    example = batch(input_shape, 2, seed)
    split = split_model(module, example, policy)
    shapes = []
    x: Any = example
    with torch.inference_mode():
        for stage in split.stages:
            shapes.append(tuple(x.shape[1:]))
            x = stage(x)
    spec = ModelSpec(name, input_shape, "classifier", build, "test: random init")
    return StagedModel(spec, module, split.stages, split.names, tuple(shapes))


# --- deployments and executors ----------------------------------------------------------------
def profile_for(model: str, num_stages: int, shape: Sequence[int] = (3, 8, 8)) -> Profile:
    """A parsed `layerbatch.profile/1` profile with `num_stages` stages (the executor only
    checks the count; the latencies do not matter to it)."""
    doc = {
        "format": "layerbatch.profile/1",
        "model": model,
        "device": "test",
        "input": {"shape": list(shape), "dtype": "float32"},
        "batch_sizes": [1, 2, 4],
        "stages": [
            {"name": f"{model}.s{k}", "latency_ms": [1.0, 1.5, 2.5], "out_bytes": 4}
            for k in range(num_stages)
        ],
        "max_batch": 8,
    }
    return parse_profile(doc, f"{model}.json")


def executor_for(
    models: Mapping[str, StagedModel],
    apps: Iterable[App] | None = None,
    channels_last: bool = False,
) -> Executor:
    profiles = [profile_for(n, len(m.stages), m.spec.input_shape) for n, m in models.items()]
    return Executor(Deployment(profiles, apps), models, channels_last=channels_last)


class StageCalls:
    """Forward hooks on a model's stages recording the batch size of every call, per stage."""

    def __init__(self, model: StagedModel) -> None:
        self.batches: list[list[int]] = [[] for _ in model.stages]
        self._handles = [
            stage.register_forward_pre_hook(functools.partial(self._record, k))
            for k, stage in enumerate(model.stages)
        ]

    def _record(self, k: int, module: nn.Module, args: tuple[Any, ...]) -> None:
        self.batches[k].append(int(args[0].shape[0]))

    @property
    def total(self) -> int:
        return sum(len(b) for b in self.batches)

    def samples(self) -> list[int]:
        """Per stage, how many samples it has run in all."""
        return [sum(b) for b in self.batches]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()

    def __enter__(self) -> StageCalls:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

"""The models layerexec can load, each split into stages.

torchvision's pretrained weights cannot be downloaded here, so its models are built with their
random initialisation under a fixed seed (the same seed gives the same weights). ResNet-20
(CIFAR-10) and UltraFace slim-320 load the real weights shipped in `layerexec/nets/weights/`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn
from torch.fx.experimental.optimization import fuse
from torchvision import models as tvm

from layerexec.detector import INPUT_SIZE, SSDFront, SSDTail
from layerexec.nets.resnet20 import CIFAR10_CLASSES, CIFAR_MEAN, CIFAR_STD
from layerexec.pointwise import route_pointwise_convs
from layerexec.split import split_model
from scheduler.validate import did_you_mean

Kind = Literal["classifier", "segmenter", "detector", "face-detector"]
WEIGHTS_DIR = Path(__file__).resolve().parent / "nets" / "weights"
DEFAULT_SEED = 0


class UnknownModel(ValueError):
    """A model name layerexec does not know; the message lists the known ones."""


@dataclass(frozen=True)
class ModelSpec:
    """A model: its input (C, H, W), what it returns, how to build it, and how an RGB image in
    0..255 becomes its input: (pixel - pixel_mean[c]) / pixel_std[c]. `labels` names its classes."""

    name: str
    input_shape: tuple[int, ...]
    kind: Kind
    build: Callable[[], nn.Module]
    weights: str  # where the weights come from, for humans
    pixel_mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    pixel_std: tuple[float, float, float] = (255.0, 255.0, 255.0)
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class StagedModel:
    """A loaded model as stages; stage k maps stage k-1's output (a batch) to its own."""

    spec: ModelSpec
    module: nn.Module
    stages: tuple[nn.Module, ...]
    names: tuple[str, ...]
    in_shapes: tuple[tuple[int, ...], ...]  # per sample, the input of each stage
    batch_norm_folded: bool = False  # into the convolutions before them (`load_model`)

    @property
    def name(self) -> str:
        return self.spec.name

    def to(self, device: torch.device | str, channels_last: bool = False) -> StagedModel:
        """Move the weights (shared by the stages) and the stages' own buffers, in place."""
        for m in (self.module, *self.stages):
            m.to(device)
            if channels_last:
                m.to(memory_format=torch.channels_last)
        return self

    def run(self, x: torch.Tensor, k0: int = 0, k1: int | None = None) -> object:
        """Stages [k0, k1) on a batch, under inference mode."""
        with torch.inference_mode():
            for stage in self.stages[k0 : len(self.stages) if k1 is None else k1]:
                x = stage(x)
        return x


class _Out(nn.Module):
    """The `out` head of a torchvision segmentation model (a tensor, not a dict)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(x)["out"]
        return out


def _resnet20() -> nn.Module:
    from layerexec.nets.resnet20 import load_resnet20

    return load_resnet20(WEIGHTS_DIR / "akamaster_resnet20-12fca82f.th")


def _ultraface() -> nn.Module:
    from layerexec.nets.ultraface import load_ultraface

    return load_ultraface(WEIGHTS_DIR / "ultraface_version-slim-320.pth")


SEEDED = "torchvision definition, random initialisation (seeded)"
# ImageNet normalisation in pixel units, as torchvision's classifiers and FCN expect it
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
IMAGENET = tuple(tvm.ResNet18_Weights.IMAGENET1K_V1.meta["categories"])
VOC = tuple(tvm.segmentation.FCN_ResNet50_Weights.COCO_WITH_VOC_LABELS_V1.meta["categories"])
COCO = tuple(tvm.detection.SSDLite320_MobileNet_V3_Large_Weights.COCO_V1.meta["categories"])


def _imagenet(name: str, build: Callable[[], nn.Module]) -> ModelSpec:
    return ModelSpec(
        name, (3, 224, 224), "classifier", build, SEEDED, IMAGENET_MEAN, IMAGENET_STD, IMAGENET
    )


MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        _imagenet("vgg16", lambda: tvm.vgg16(weights=None)),
        _imagenet("resnet50", lambda: tvm.resnet50(weights=None)),
        _imagenet("resnet18", lambda: tvm.resnet18(weights=None)),
        _imagenet(
            "googlenet", lambda: tvm.googlenet(weights=None, aux_logits=False, init_weights=True)
        ),
        _imagenet("mobilenet_v2", lambda: tvm.mobilenet_v2(weights=None)),
        ModelSpec(
            "fcn_resnet50",
            (3, 224, 224),
            "segmenter",
            lambda: _Out(
                tvm.segmentation.fcn_resnet50(weights=None, weights_backbone=None, aux_loss=False)
            ),
            SEEDED,
            IMAGENET_MEAN,
            IMAGENET_STD,
            VOC,
        ),
        ModelSpec(
            "ssdlite320_mobilenet_v3_large",
            (3, INPUT_SIZE, INPUT_SIZE),
            "detector",
            lambda: tvm.detection.ssdlite320_mobilenet_v3_large(
                weights=None, weights_backbone=None
            ),
            SEEDED,
            labels=COCO,
        ),
        ModelSpec(
            "resnet20_cifar10",
            (3, 32, 32),
            "classifier",
            _resnet20,
            "akamaster/pytorch_resnet_cifar10 (BSD-2)",
            (255 * CIFAR_MEAN[0], 255 * CIFAR_MEAN[1], 255 * CIFAR_MEAN[2]),
            (255 * CIFAR_STD[0], 255 * CIFAR_STD[1], 255 * CIFAR_STD[2]),
            CIFAR10_CLASSES,
        ),
        ModelSpec(
            "ultraface_slim320",
            (3, 240, 320),
            "face-detector",
            _ultraface,
            "Linzaer/Ultra-Light-Fast-Generic-Face-Detector-1MB (MIT)",
            (127.0, 127.0, 127.0),
            (128.0, 128.0, 128.0),
            ("face",),
        ),
    )
}


def spec(name: str) -> ModelSpec:
    if name not in MODELS:
        hint = did_you_mean(name, sorted(MODELS))
        raise UnknownModel(
            f"unknown model {name!r}: expected one of {', '.join(sorted(MODELS))}{hint}"
        )
    return MODELS[name]


def load_models(
    names: Iterable[str], seed: int = DEFAULT_SEED, fold_batch_norm: bool = True
) -> dict[str, StagedModel]:
    """Each named model loaded once: apps that list the same model share it (one copy)."""
    return {n: load_model(n, seed, fold_batch_norm) for n in dict.fromkeys(names)}


def load_model(name: str, seed: int = DEFAULT_SEED, fold_batch_norm: bool = True) -> StagedModel:
    """Build `name` (eval mode; seeded random weights unless it ships real ones) and split it.

    With `fold_batch_norm` (the default) every batch norm that follows a convolution is folded
    into that convolution's weights and bias first (`torch.fx.experimental.optimization.fuse`):
    the same function up to float rounding (relative 1e-6), one op fewer per layer, the same
    stages (cuts fall before convolutions, so a convolution and its batch norm share a stage).
    The detector is left unfolded: its tail runs the torchvision module itself. Every 1x1
    convolution then runs on oneDNN at every batch size (`layerexec.pointwise`): on one torch
    thread below batch 16, torch would run it on a slower kernel."""
    s = spec(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = s.build().eval()
    example = torch.rand(2, *s.input_shape, generator=torch.Generator().manual_seed(seed))
    if s.kind == "detector":
        front = split_model(SSDFront(module), example)
        stages = (*front.stages, SSDTail(module).eval())
        names = (*front.names, "features.1+extra+head+postprocess")
    else:
        if fold_batch_norm:
            module = fuse(module)
        split = split_model(module, example)
        stages, names = split.stages, split.names
    for part in (module, *stages):  # the stages too, should a split have copied a convolution
        route_pointwise_convs(part)
    names = tuple(n.replace("model.", "") if n.startswith("model.") else n for n in names)
    shapes = []
    x: object = example
    with torch.inference_mode():
        for stage in stages:
            assert isinstance(x, torch.Tensor)
            shapes.append(tuple(x.shape[1:]))
            x = stage(x)
    folded = fold_batch_norm and s.kind != "detector"
    return StagedModel(s, module, tuple(stages), names, tuple(shapes), folded)

"""ResNet-20 for CIFAR-10, as defined in akamaster/pytorch_resnet_cifar10 (``resnet.py``).

The architecture is the one of He et al. 2016, section 4.2, for CIFAR-10: a 3x3 stem with 16
channels, three stages of three ``BasicBlock``s with 16, 32 and 64 channels (the first block of
stages 2 and 3 has stride 2), global average pooling and a linear layer 64 -> 10. Shortcuts are
"option A": where the shape changes, the input is subsampled by 2 in both spatial dimensions and
zero-padded in channels, so shortcuts carry no parameters.

The one departure from the original source is mechanical: the original option-A shortcut is a
``LambdaLayer`` wrapping a Python lambda, which ``torch.fx.symbolic_trace`` cannot inline into a
graph a user can split. Here it is ``PadShortcut``, a parameterless module computing the same
``F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, planes // 4, planes // 4))``; the state-dict keys are
unchanged because neither module owns a tensor. The final pooling is
``F.adaptive_avg_pool2d(out, 1)`` rather than ``F.avg_pool2d(out, out.size()[3])``: the same mean
over the whole 8x8 map for 32x32 inputs, with no shape-dependent arguments in the traced graph.

The shipped weights (``weights/akamaster_resnet20-12fca82f.th``, BSD-2-Clause, see
``weights/akamaster_LICENSE_BSD-2.txt``) reach 91.78% top-1 on the CIFAR-10 test set according
to the checkpoint's own ``best_prec1``. Inputs are RGB in [0, 1] normalised with ``CIFAR_MEAN``
and ``CIFAR_STD`` (the ImageNet statistics, as akamaster's training script uses).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from layerexec.nets.checkpoint import Unusable, load_strict

RESNET20_WEIGHTS = Path(__file__).resolve().parent / "weights" / "akamaster_resnet20-12fca82f.th"
"""The shipped ResNet-20 checkpoint (sha256 prefix 12fca82f, as its name says)."""

CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
"""CIFAR-10 class names in the order of the network's 10 outputs."""

CIFAR_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
CIFAR_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)
"""Per-channel normalisation of RGB inputs in [0, 1] that the shipped weights were trained with."""


def _weights_init(module: nn.Module) -> None:
    """Kaiming-normal initialisation of conv and linear weights, as in the original source."""
    if isinstance(module, nn.Linear | nn.Conv2d):
        nn.init.kaiming_normal_(module.weight)


class PadShortcut(nn.Module):
    """Option-A shortcut: subsample by 2 spatially, zero-pad ``pad_channels`` on each side in
    channels. Owns no parameters or buffers; traceable by ``torch.fx``."""

    def __init__(self, pad_channels: int) -> None:
        super().__init__()
        self.pad_channels = pad_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, C, H, W) -> (N, C + 2 * pad_channels, ceil(H / 2), ceil(W / 2))``."""
        return F.pad(
            x[:, :, ::2, ::2],
            (0, 0, 0, 0, self.pad_channels, self.pad_channels),
            "constant",
            0.0,
        )

    def extra_repr(self) -> str:
        return f"pad_channels={self.pad_channels}"


class BasicBlock(nn.Module):
    """Two 3x3 conv + batch-norm layers with a residual connection (option-A shortcut)."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(
            in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False
        )
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = PadShortcut(planes // 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out = out + self.shortcut(x)
        return F.relu(out)


class ResNet(nn.Module):
    """CIFAR ResNet (6n + 2 layers); ``forward`` maps ``(N, 3, 32, 32)`` to logits ``(N, 10)``."""

    def __init__(self, num_blocks: tuple[int, int, int], num_classes: int = 10) -> None:
        super().__init__()
        self.in_planes = 16
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = self._make_layer(16, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(32, num_blocks[1], stride=2)
        self.layer3 = self._make_layer(64, num_blocks[2], stride=2)
        self.linear = nn.Linear(64, num_classes)
        self.apply(_weights_init)

    def _make_layer(self, planes: int, num_blocks: int, stride: int) -> nn.Sequential:
        layers: list[nn.Module] = []
        for block_stride in [stride] + [1] * (num_blocks - 1):
            layers.append(BasicBlock(self.in_planes, planes, block_stride))
            self.in_planes = planes * BasicBlock.expansion
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer1(out)
        out = self.layer2(out)
        out = self.layer3(out)
        out = F.adaptive_avg_pool2d(out, 1)
        out = torch.flatten(out, 1)
        logits: torch.Tensor = self.linear(out)
        return logits


def resnet20(num_classes: int = 10) -> ResNet:
    """A randomly initialised (Kaiming, from torch's global RNG) ResNet-20 in training mode.

    Its ``state_dict()`` keys are those of akamaster's ``resnet20()`` without the ``module.``
    prefix that ``nn.DataParallel`` added to the shipped checkpoint.
    """
    return ResNet((3, 3, 3), num_classes)


def load_resnet20(path: str | os.PathLike[str] = RESNET20_WEIGHTS) -> ResNet:
    """ResNet-20 with the weights of the akamaster checkpoint at ``path``, in eval mode, on CPU.

    The checkpoint is read with ``torch.load(weights_only=True)`` (it holds only ``best_prec1``,
    a float, and ``state_dict``); the ``module.`` prefix is stripped from the keys and the result
    is loaded with ``strict=True``. The checkpoint predates ``BatchNorm2d.num_batches_tracked``;
    batch norm fills that counter in itself when it is absent, and it does not affect eval mode.
    Its tensors were saved from ``cuda:0``; they are mapped to CPU, so no GPU is needed.

    Raises ``FileNotFoundError`` if ``path`` does not exist and ``ValueError`` (one sentence
    naming the file) if it cannot be read or does not hold ResNet-20 weights.
    """
    expected = "an akamaster ResNet-20 CIFAR-10 weights file (a torch checkpoint with 'state_dict')"
    return load_strict(resnet20(), path, expected, _akamaster_state)


def _akamaster_state(checkpoint: object) -> dict[str, Any]:
    """The checkpoint's state dict without the `module.` prefix nn.DataParallel added."""
    state = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise Unusable("it has no 'state_dict' dictionary")
    return {
        (k[len("module.") :] if isinstance(k, str) and k.startswith("module.") else k): v
        for k, v in state.items()
    }

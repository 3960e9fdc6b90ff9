"""UltraFace "version-slim" face detector at 320x240 (Linzaer/Ultra-Light-Fast-Generic-Face-Detector-1MB).

Definitions follow ``vision/nn/mb_tiny.py`` (backbone ``Mb_Tiny``), ``vision/ssd/mb_tiny_fd.py``
(heads), ``vision/ssd/ssd.py`` (``SSD.forward`` in test mode), ``vision/utils/box_utils.py``
(priors and box decoding) and ``vision/ssd/config/fd_config.py`` with ``define_img_size(320)``.

Network: a MobileNet-style backbone of 13 blocks (one 3x3 conv-bn-relu with stride 2, then
depthwise-separable conv-bn-relu blocks; base width 16) and one extra block. SSD heads read
four feature maps: after backbone block 7 (64 ch, 40x30), block 10 (128 ch, 20x15), block 12
(256 ch, 10x8) and the extra block (256 ch, 5x4), with 3, 2, 2 and 3 priors per cell:
40*30*3 + 20*15*2 + 10*8*2 + 5*4*3 = 4420 priors. In test mode the class logits are
softmaxed over (background, face), and the regressions are decoded against the priors:

    center = loc[:2] * center_variance * prior_wh + prior_center
    size   = exp(loc[2:] * size_variance) * prior_wh

then converted to corner form ``(x1, y1, x2, y2)``, relative to the image (0..1, not clipped).

Differences from the source are mechanical and keep the state-dict keys and the arithmetic:
the priors are a non-persistent buffer computed at construction (the source keeps them as a plain
attribute), the backbone slices between heads are unrolled at construction, and the reshape of
head outputs uses ``flatten``/``unflatten`` so ``torch.fx.symbolic_trace`` records no
shape-dependent nodes.

The shipped weights (``weights/ultraface_version-slim-320.pth``, MIT, see
``weights/ultraface_LICENSE_MIT.txt``) expect RGB input normalised as ``(pixel - 127) / 128``.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from layerexec.nets.checkpoint import load_strict

ULTRAFACE_WEIGHTS = Path(__file__).resolve().parent / "weights" / "ultraface_version-slim-320.pth"
"""The shipped UltraFace version-slim-320 state dict."""

IMAGE_SIZE_WH: tuple[int, int] = (320, 240)
"""Input width and height the network and its priors are built for."""
IMAGE_MEAN = 127.0
IMAGE_STD = 128.0
"""Input normalisation: ``(rgb_pixel - IMAGE_MEAN) / IMAGE_STD`` on 0..255 pixel values."""
CENTER_VARIANCE = 0.1
SIZE_VARIANCE = 0.2
FEATURE_MAPS_WH: tuple[tuple[int, int], ...] = ((40, 30), (20, 15), (10, 8), (5, 4))
MIN_BOXES: tuple[tuple[int, ...], ...] = ((10, 16, 24), (32, 48), (64, 96), (128, 192, 256))
NUM_PRIORS = sum(w * h * len(b) for (w, h), b in zip(FEATURE_MAPS_WH, MIN_BOXES, strict=True))
"""4420: the number of boxes the detector scores for one image."""

_BASE_CHANNEL = 16
_SOURCE_LAYER_INDEXES = (8, 11, 13)
"""Heads 0..2 read the backbone output just before these block indexes (as in the source)."""


def generate_priors(
    feature_maps_wh: tuple[tuple[int, int], ...] = FEATURE_MAPS_WH,
    min_boxes: tuple[tuple[int, ...], ...] = MIN_BOXES,
    image_size_wh: tuple[int, int] = IMAGE_SIZE_WH,
) -> torch.Tensor:
    """Priors ``(num_priors, 4)`` as ``(cx, cy, w, h)`` relative to the image, clamped to [0, 1].

    Ordered as ``box_utils.generate_priors``: feature map, then row ``j``, column ``i``, then
    min box; this is the order of the heads' flattened ``(N, H, W, anchors)`` outputs.
    """
    priors: list[list[float]] = []
    for (fm_w, fm_h), boxes in zip(feature_maps_wh, min_boxes, strict=True):
        # The source computes scale = image_size / (image_size / fm); the same float here.
        scale_w = image_size_wh[0] / (image_size_wh[0] / fm_w)
        scale_h = image_size_wh[1] / (image_size_wh[1] / fm_h)
        for j, i in itertools.product(range(fm_h), range(fm_w)):
            x_center = (i + 0.5) / scale_w
            y_center = (j + 0.5) / scale_h
            for min_box in boxes:
                priors.append(
                    [x_center, y_center, min_box / image_size_wh[0], min_box / image_size_wh[1]]
                )
    return torch.tensor(priors, dtype=torch.float32).clamp_(0.0, 1.0)


def _conv_bn(inp: int, oup: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(inp, oup, 3, stride, 1, bias=False),
        nn.BatchNorm2d(oup),
        nn.ReLU(inplace=True),
    )


def _conv_dw(inp: int, oup: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(inp, inp, 3, stride, 1, groups=inp, bias=False),
        nn.BatchNorm2d(inp),
        nn.ReLU(inplace=True),
        nn.Conv2d(inp, oup, 1, 1, 0, bias=False),
        nn.BatchNorm2d(oup),
        nn.ReLU(inplace=True),
    )


def _mb_tiny_backbone() -> nn.Sequential:
    """``Mb_Tiny.model``: 13 blocks, 3 -> 256 channels, stride 32 overall."""
    c = _BASE_CHANNEL
    return nn.Sequential(
        _conv_bn(3, c, 2),  # 160x120
        _conv_dw(c, c * 2, 1),
        _conv_dw(c * 2, c * 2, 2),  # 80x60
        _conv_dw(c * 2, c * 2, 1),
        _conv_dw(c * 2, c * 4, 2),  # 40x30
        _conv_dw(c * 4, c * 4, 1),
        _conv_dw(c * 4, c * 4, 1),
        _conv_dw(c * 4, c * 4, 1),
        _conv_dw(c * 4, c * 8, 2),  # 20x15
        _conv_dw(c * 8, c * 8, 1),
        _conv_dw(c * 8, c * 8, 1),
        _conv_dw(c * 8, c * 16, 2),  # 10x8
        _conv_dw(c * 16, c * 16, 1),
    )


def _separable_conv(
    in_channels: int, out_channels: int, kernel_size: int = 1, stride: int = 1, padding: int = 0
) -> nn.Sequential:
    """``SeperableConv2d`` of the source: depthwise conv (with bias), ReLU, pointwise conv."""
    return nn.Sequential(
        nn.Conv2d(
            in_channels,
            in_channels,
            kernel_size=kernel_size,
            groups=in_channels,
            stride=stride,
            padding=padding,
        ),
        nn.ReLU(),
        nn.Conv2d(in_channels, out_channels, kernel_size=1),
    )


class UltraFaceSlim(nn.Module):
    """UltraFace version-slim SSD in test mode.

    ``forward(x)`` takes ``x`` of shape ``(N, 3, 240, 320)``, RGB normalised as
    ``(pixel - 127) / 128``, and returns ``(scores, boxes)``: ``scores`` ``(N, 4420, 2)``
    softmaxed over (background, face) and ``boxes`` ``(N, 4420, 4)`` as ``(x1, y1, x2, y2)``
    relative to the image. Its state-dict keys are those of the source's ``create_mb_tiny_fd``.
    """

    def __init__(self, num_classes: int = 2) -> None:
        super().__init__()
        c = _BASE_CHANNEL
        self.num_classes = num_classes
        self.base_net = _mb_tiny_backbone()
        self.extras = nn.ModuleList(
            [
                nn.Sequential(
                    nn.Conv2d(c * 16, c * 4, kernel_size=1),
                    nn.ReLU(),
                    _separable_conv(c * 4, c * 16, kernel_size=3, stride=2, padding=1),
                    nn.ReLU(),
                )
            ]
        )
        self.regression_headers = nn.ModuleList(
            [
                _separable_conv(c * 4, 3 * 4, kernel_size=3, padding=1),
                _separable_conv(c * 8, 2 * 4, kernel_size=3, padding=1),
                _separable_conv(c * 16, 2 * 4, kernel_size=3, padding=1),
                nn.Conv2d(c * 16, 3 * 4, kernel_size=3, padding=1),
            ]
        )
        self.classification_headers = nn.ModuleList(
            [
                _separable_conv(c * 4, 3 * num_classes, kernel_size=3, padding=1),
                _separable_conv(c * 8, 2 * num_classes, kernel_size=3, padding=1),
                _separable_conv(c * 16, 2 * num_classes, kernel_size=3, padding=1),
                nn.Conv2d(c * 16, 3 * num_classes, kernel_size=3, padding=1),
            ]
        )
        self.priors: torch.Tensor
        self.register_buffer("priors", generate_priors(), persistent=False)

    def _header(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Head ``i`` on feature map ``x``: logits ``(N, H*W*A, C)``, locations ``(N, H*W*A, 4)``."""
        confidence = self.classification_headers[i](x).permute(0, 2, 3, 1)
        confidence = torch.flatten(confidence, 1).unflatten(1, (-1, self.num_classes))
        location = self.regression_headers[i](x).permute(0, 2, 3, 1)
        location = torch.flatten(location, 1).unflatten(1, (-1, 4))
        return confidence, location

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        confidences: list[torch.Tensor] = []
        locations: list[torch.Tensor] = []
        start = 0
        for header, end in enumerate(_SOURCE_LAYER_INDEXES):
            for layer in self.base_net[start:end]:
                x = layer(x)
            start = end
            confidence, location = self._header(header, x)
            confidences.append(confidence)
            locations.append(location)
        for layer in self.base_net[start:]:
            x = layer(x)
        for header, layer in enumerate(self.extras, start=len(_SOURCE_LAYER_INDEXES)):
            x = layer(x)
            confidence, location = self._header(header, x)
            confidences.append(confidence)
            locations.append(location)

        scores = F.softmax(torch.cat(confidences, 1), dim=2)
        loc = torch.cat(locations, 1)
        priors = self.priors
        centers = loc[..., :2] * CENTER_VARIANCE * priors[..., 2:] + priors[..., :2]
        sizes = torch.exp(loc[..., 2:] * SIZE_VARIANCE) * priors[..., 2:]
        boxes = torch.cat([centers - sizes / 2, centers + sizes / 2], dim=2)
        return scores, boxes


def ultraface_slim320() -> UltraFaceSlim:
    """A randomly initialised (torch defaults) UltraFace version-slim-320 in training mode."""
    return UltraFaceSlim()


def load_ultraface(path: str | os.PathLike[str] = ULTRAFACE_WEIGHTS) -> UltraFaceSlim:
    """UltraFace version-slim-320 with the state dict at ``path``, in eval mode, on CPU.

    The file is read with ``torch.load(weights_only=True)`` and loaded with ``strict=True``. Its
    tensors were saved from ``cuda:0``; they are mapped to CPU, so no GPU is needed.
    Raises ``FileNotFoundError`` if ``path`` does not exist and ``ValueError`` (one sentence
    naming the file) if it cannot be read or does not hold UltraFace slim weights.
    """
    expected = "an UltraFace version-slim-320 weights file (a torch state dict)"
    return load_strict(ultraface_slim320(), path, expected)

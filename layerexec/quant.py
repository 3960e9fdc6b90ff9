"""INT8 feature maps at a stage boundary: per-tensor affine quantisation to uint8.

    q = clamp(round(x / scale) + zero_point, 0, 255),   x' = (q - zero_point) * scale
with scale = (max - min) / 255 and zero_point = round(-min / scale), over the whole tensor (the
range always includes 0, which is represented exactly). The error per element is at most half a
step (scale / 2), up to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Quantised:
    data: torch.Tensor  # uint8, same shape as the input
    scale: float
    zero_point: int


def quantise(x: torch.Tensor) -> Quantised:
    lo = min(float(x.min()), 0.0)
    hi = max(float(x.max()), 0.0)
    scale = (hi - lo) / 255.0 if hi > lo else 1.0
    zero_point = round(-lo / scale)
    q = torch.clamp(torch.round(x / scale) + zero_point, 0, 255).to(torch.uint8)
    return Quantised(q, scale, zero_point)


def dequantise(q: Quantised, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (q.data.to(dtype) - q.zero_point) * q.scale

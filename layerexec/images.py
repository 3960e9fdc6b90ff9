"""An RGB image as a model's input: resized to the model's (H, W) and normalised per channel,
the same on the server (after decoding a JPEG) and on a client running the first stages."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import torch

from layerexec.zoo import ModelSpec


def resize_rgb(rgb: np.ndarray, spec: ModelSpec) -> np.ndarray:
    """An H x W x 3 uint8 image at the model's input size (unchanged if it already is)."""
    _, h, w = spec.input_shape
    if rgb.shape[:2] == (h, w):
        return rgb
    return cv2.resize(rgb, (w, h), interpolation=cv2.INTER_LINEAR)


def rgb_tensor(rgb: np.ndarray, spec: ModelSpec) -> torch.Tensor:
    """(C, H, W) float32 for `spec`'s first stage: (pixel - pixel_mean[c]) * (1 / pixel_std[c]),
    in float32. Its memory is (H, W, C), channels-last, as the executor runs models: a batch
    gathers without a transpose. Two passes over the resized image (subtract while converting,
    then scale), each an OpenCV per-channel scalar op: 3-4x faster than numpy broadcasting a
    3-vector over the last axis, with the same float32 result (`bench/image_input.py`)."""
    x = resize_rgb(rgb, spec)
    out = cv2.subtract(x, _scalar(spec.pixel_mean), dtype=cv2.CV_32F)
    cv2.multiply(out, _scalar(1.0 / np.asarray(spec.pixel_std, dtype=np.float32)), dst=out)
    return torch.from_numpy(out).permute(2, 0, 1)


def _scalar(per_channel: Sequence[float] | np.ndarray) -> np.ndarray:
    """Per-channel values (at most 4) rounded to float32, as an OpenCV scalar (4 x 1 float64)."""
    v = np.zeros((4, 1), dtype=np.float64)
    c = np.asarray(per_channel, dtype=np.float32)
    v[: c.size, 0] = c
    return v

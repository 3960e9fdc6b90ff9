"""An RGB image as a model's input: resized to the model's (H, W) and normalised per channel,
the same on the server (after decoding a JPEG) and on a client running the first stages."""

from __future__ import annotations

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
    """(C, H, W) float32 for `spec`'s first stage: (pixel - pixel_mean[c]) / pixel_std[c]. Its
    memory is (H, W, C), channels-last, as the executor runs models: a batch gathers without a
    transpose. Two passes over the resized image (subtract while converting, then scale)."""
    x = resize_rgb(rgb, spec)
    out = np.subtract(x, np.asarray(spec.pixel_mean, dtype=np.float32), dtype=np.float32)
    out *= 1.0 / np.asarray(spec.pixel_std, dtype=np.float32)
    return torch.from_numpy(out).permute(2, 0, 1)

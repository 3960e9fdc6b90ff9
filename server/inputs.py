"""Turning what a client sends into the tensor a stage takes: a JPEG frame (OpenCV decode, resize
to the model's input, normalise), or an INT8 feature map (H.264 or raw) for a later stage."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np
import torch

from layerexec.features import CODECS, FeatureError, decode_features
from layerexec.zoo import ModelSpec
from server.errors import BadRequest


def image_tensor(jpeg: bytes, spec: ModelSpec) -> torch.Tensor:
    """(C, H, W) float32 for `spec`'s first stage from an encoded image (JPEG, PNG, ...)."""
    img = cv2.imdecode(np.frombuffer(jpeg, dtype=np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise BadRequest(422, "payload.jpeg: expected an encoded image (JPEG), could not decode it")
    return rgb_tensor(cv2.cvtColor(img, cv2.COLOR_BGR2RGB), spec)


def rgb_tensor(rgb: np.ndarray, spec: ModelSpec) -> torch.Tensor:
    """An H x W x 3 RGB uint8 image resized and normalised for `spec`."""
    _, h, w = spec.input_shape
    if rgb.shape[:2] != (h, w):
        rgb = cv2.resize(rgb, (w, h), interpolation=cv2.INTER_LINEAR)
    x = rgb.astype(np.float32)
    x -= np.asarray(spec.pixel_mean, dtype=np.float32)
    x /= np.asarray(spec.pixel_std, dtype=np.float32)
    return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))


def feature_tensor(features: Mapping[str, Any], expected: Sequence[int]) -> torch.Tensor:
    """The dequantised feature map; its declared shape must be the stage's input shape."""
    shape = features["shape"]
    if list(shape) != list(expected):
        raise BadRequest(
            422,
            f"payload.features.shape: expected {list(expected)} for stage {features['position']}, "
            f"got {list(shape)}",
        )
    if features["codec"] not in CODECS:
        raise BadRequest(422, f"payload.features.codec: expected one of {', '.join(CODECS)}")
    try:
        return decode_features(
            shape, features["scale"], features["zero_point"], features["codec"], features["data"]
        )
    except FeatureError as exc:
        raise BadRequest(422, f"payload.features.data: {exc}") from None

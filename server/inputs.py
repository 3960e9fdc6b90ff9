"""Turning what a client sends into the tensor a stage takes: a JPEG frame (OpenCV decode, resize
to the model's input, normalise), or an INT8 feature map (H.264 or raw) for a later stage."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np
import torch

from layerexec.features import CODECS, FeatureError, decode_features
from layerexec.images import resize_rgb, rgb_tensor
from layerexec.zoo import ModelSpec
from server.errors import BadRequest


def image_tensor(jpeg: bytes, spec: ModelSpec) -> torch.Tensor:
    """(C, H, W) float32 for `spec`'s first stage from an encoded image (JPEG, PNG, ...)."""
    img = cv2.imdecode(np.frombuffer(jpeg, dtype=np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise BadRequest(422, "payload.jpeg: expected an encoded image (JPEG), could not decode it")
    # resized first: the colour swap then touches the model's input size, not the frame's
    return rgb_tensor(cv2.cvtColor(resize_rgb(img, spec), cv2.COLOR_BGR2RGB), spec)


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

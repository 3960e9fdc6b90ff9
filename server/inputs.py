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

# an 8K frame is 33 megapixels; a larger image would hold the decode thread, and every request
# queued behind it, for a second or more (a 25000 x 25000 JPEG: 4.7 s; a 20000 x 20000 TIFF of
# 1.8 MB: 7.3 s, which is why only formats whose size is read from the header are taken)
MAX_IMAGE_PIXELS = 40_000_000
_PNG = b"\x89PNG\r\n\x1a\n"
# the JPEG start-of-frame markers, which carry the image's size (all but DHT C4, JPG C8, DAC CC)
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def image_tensor(jpeg: bytes, spec: ModelSpec) -> torch.Tensor:
    """(C, H, W) float32 for `spec`'s first stage from a JPEG or PNG image. BadRequest(422)
    for no bytes, another format, more than MAX_IMAGE_PIXELS (read from the header, before
    decoding) or bytes that do not decode."""
    if not jpeg:
        raise BadRequest(422, "payload.jpeg: expected an encoded image (JPEG), got 0 bytes")
    size = encoded_size(jpeg)
    if size is None:
        raise BadRequest(
            422, "payload.jpeg: expected a JPEG or PNG image, could not decode a header of either"
        )
    if size[0] * size[1] > MAX_IMAGE_PIXELS:
        raise BadRequest(
            422,
            f"payload.jpeg: expected at most {MAX_IMAGE_PIXELS / 1e6:g} megapixels, "
            f"got {size[0]}x{size[1]}",
        )
    try:
        img = cv2.imdecode(np.frombuffer(jpeg, dtype=np.uint8), cv2.IMREAD_COLOR)
    except cv2.error:
        img = None
    if img is None:
        raise BadRequest(422, "payload.jpeg: expected an encoded image (JPEG), could not decode it")
    # resized first: the colour swap then touches the model's input size, not the frame's
    return rgb_tensor(cv2.cvtColor(resize_rgb(img, spec), cv2.COLOR_BGR2RGB), spec)


def encoded_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's start-of-frame or a PNG's IHDR header, without decoding;
    None for another format or a header that does not say."""
    if data.startswith(_PNG) and data[12:16] == b"IHDR" and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if not data.startswith(b"\xff\xd8"):
        return None
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # standalone markers: no length
            i += 2
            continue
        if marker == 0xDA:  # start of scan: the frame header would have come before it
            return None
        if marker in _SOF and i + 9 <= len(data):
            return int.from_bytes(data[i + 7 : i + 9], "big"), int.from_bytes(
                data[i + 5 : i + 7], "big"
            )
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return None


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

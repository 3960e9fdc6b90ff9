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
# a PNG's last chunk: length 0, type IEND, its CRC (the same 12 bytes in every PNG)
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"
_JPEG_END = b"\xff\xd9"  # end of image
# the JPEG start-of-frame markers, which carry the image's size (all but DHT C4, JPG C8, DAC CC)
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# markers walked before a JPEG's first scan at most: an encoder writes a dozen or so (metadata
# comes in segments of up to 64 KB: 256 of them for 16 MB); a walk without a bound would hold the
# decode thread 1.8 s on 16 MB of fill bytes or empty comments
_MAX_MARKERS = 1000


def image_tensor(jpeg: bytes, spec: ModelSpec) -> torch.Tensor:
    """(C, H, W) float32 for `spec`'s first stage from a JPEG or PNG image. BadRequest(422)
    for no bytes, another format, more than MAX_IMAGE_PIXELS (read from the header, before
    decoding), an image cut off before its end (a JPEG with no end-of-image marker after its
    first scan begins, a PNG without its IEND chunk: found without decoding, for a decoder may
    fill a cut-off JPEG's missing rows with grey and say nothing, as OpenCV 4 does) or bytes
    that do not decode."""
    if not jpeg:
        raise BadRequest(422, "payload.jpeg: expected an encoded image (JPEG), got 0 bytes")
    size, complete = _header(jpeg)
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
    if not complete:
        what = "PNG" if jpeg.startswith(_PNG) else "JPEG"
        end = "IEND chunk" if what == "PNG" else "end-of-image marker"
        raise BadRequest(
            422,
            f"payload.jpeg: expected a complete {what}, got {len(jpeg)} bytes that end before "
            f"its {end} (the image was cut off)",
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
    return _header(data)[0]


def _header(data: bytes) -> tuple[tuple[int, int] | None, bool]:
    """`encoded_size(data)`, and whether the data reaches the image's end: a PNG's IEND chunk,
    a JPEG's end-of-image marker after its first start-of-scan. Entropy-coded data never holds
    the bytes FF D9 (an FF there is followed by 00 or a restart marker's D0-D7), so one search
    from the end tells; an EOI earlier in the file (an EXIF thumbnail's, in an APP1 segment
    the walk steps over) does not count. Bytes after the end are allowed (OpenCV takes them).
    Each check is one C-level search from the end (a complete image's end is found at once).
    A progressive JPEG cut in a later scan is told apart only if the tables between its scans
    hold no FF D9."""
    if data.startswith(_PNG):
        if data[12:16] != b"IHDR" or len(data) < 24:
            return None, False
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        # the IEND chunk comes after the signature and IHDR chunk (33 bytes)
        return (width, height), data.rfind(_PNG_END, 33) != -1
    if not data.startswith(b"\xff\xd8"):
        return None, False
    size, scan = _jpeg_walk(data)
    return size, size is not None and data.rfind(_JPEG_END, scan) != -1


def _jpeg_walk(data: bytes) -> tuple[tuple[int, int] | None, int]:
    """Walk a JPEG's marker segments from its SOI: (width, height) from its start-of-frame
    (None if none comes before the first start-of-scan, or before the walk stops), and the
    offset where the first scan's entropy-coded data begins. Where the walk stops before that
    scan (at a byte that is not a marker, an EOI, after _MAX_MARKERS markers) it gives the
    offset it stopped at, where the scan can begin no earlier; where the data ends first, an
    offset at or past its end."""
    size = None
    i = 2
    for _ in range(_MAX_MARKERS):
        if i + 4 > len(data) or data[i] != 0xFF:
            break
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # standalone markers: no length
            i += 2
            continue
        if marker == 0xD9:  # end of image before any scan: nothing to decode
            break
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if marker == 0xDA:  # start of scan: its entropy-coded data follows its header
            return size, i + 2 + length
        if size is None and marker in _SOF and i + 9 <= len(data):
            size = (
                int.from_bytes(data[i + 7 : i + 9], "big"),
                int.from_bytes(data[i + 5 : i + 7], "big"),
            )
        i += 2 + length
    return size, i


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

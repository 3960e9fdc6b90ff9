"""Feature maps on the wire: INT8 (per-tensor affine, `quant.py`) tiled into one grayscale frame
and compressed losslessly with H.264 (paper 003 sections 4.4 and 5.2).

A tensor of any shape is viewed as N planes of H x W (the last two dimensions); a tensor whose
planes are single rows (a vector, or H == 1) is instead one square plane of side
ceil(sqrt(size)), zero-padded (libx264 refuses frames wider than 16384, and a 1 x L frame codes
badly). The planes are tiled row by row into a grid of ceil(sqrt(N)) columns, and the frame is
encoded by libx264 with `pix_fmt=gray` and `qp=0` in one call. The decoder returns yuv420p
frames whose Y plane holds exactly the bytes sent (reading them as gray, or encoding a yuv
format, would rescale the range), so decode_uint8(encode_uint8(q)) == q for every non-empty
uint8 array (an empty one is refused with FeatureError). Data cut short is refused too (the
decoder runs with `err_detect=explode`); TCP's checksums are trusted against flipped bits.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

import av
import numpy as np
import torch

from layerexec.quant import Quantised, dequantise, quantise

CODECS = ("h264", "raw")


class FeatureError(ValueError):
    """Feature-map bytes that cannot be decoded into the expected shape; says why."""


@dataclass(frozen=True)
class EncodedFeatures:
    """What a client sends instead of a frame: the input of stage `position`, compressed."""

    position: int
    shape: tuple[int, ...]
    scale: float
    zero_point: int
    codec: str
    data: bytes


def _planes(shape: Sequence[int]) -> tuple[int, int, int]:
    """(N, H, W) of the planes that hold an array of `shape` (module docstring)."""
    size = math.prod(shape)
    if size == 0:
        raise FeatureError(f"shape {list(shape)}: expected a non-empty feature map")
    if len(shape) < 2 or shape[-2] == 1:
        side = math.isqrt(size - 1) + 1
        return 1, side, side
    return math.prod(shape[:-2]), shape[-2], shape[-1]


def tile(q: np.ndarray) -> np.ndarray:
    """uint8 array of any shape -> one 2-D frame with its planes in a grid."""
    n, h, w = _planes(q.shape)
    flat = q.reshape(-1)
    if flat.size < n * h * w:
        flat = np.concatenate([flat, np.zeros(n * h * w - flat.size, np.uint8)])
    planes = flat.reshape(n, h, w)
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    frame = np.zeros((rows * h, cols * w), dtype=np.uint8)
    for i in range(n):
        r, c = divmod(i, cols)
        frame[r * h : (r + 1) * h, c * w : (c + 1) * w] = planes[i]
    return frame


def untile(frame: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    n, h, w = _planes(shape)
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    if frame.shape != (rows * h, cols * w):
        raise FeatureError(
            f"a frame of {frame.shape[1]}x{frame.shape[0]} does not hold shape {list(shape)} "
            f"(expected {cols * w}x{rows * h})"
        )
    out = np.empty((n, h, w), dtype=np.uint8)
    for i in range(n):
        r, c = divmod(i, cols)
        out[i] = frame[r * h : (r + 1) * h, c * w : (c + 1) * w]
    return out.reshape(-1)[: math.prod(shape)].reshape(tuple(shape))


def encode_uint8(q: np.ndarray) -> bytes:
    """Lossless H.264 of a uint8 array (see the module docstring)."""
    frame = tile(np.ascontiguousarray(q, dtype=np.uint8))
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="h264") as container:
        stream = container.add_stream("libx264", rate=1)
        stream.width, stream.height = frame.shape[1], frame.shape[0]
        stream.pix_fmt = "gray"
        stream.options = {"qp": "0", "preset": "ultrafast"}
        for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="gray")):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()


def decode_uint8(data: bytes, shape: Sequence[int]) -> np.ndarray:
    """The uint8 array of `shape` that `encode_uint8` encoded into `data`."""
    try:
        with av.open(io.BytesIO(data), mode="r", format="h264") as container:
            container.streams.video[0].codec_context.options = {"err_detect": "explode"}
            frame = next(container.decode(video=0), None)
    except (av.error.FFmpegError, ValueError) as exc:
        raise FeatureError(f"the H.264 data could not be decoded ({exc})") from None
    if frame is None:
        raise FeatureError("the H.264 data holds no frame")
    plane = frame.planes[0]
    y = np.frombuffer(memoryview(plane), np.uint8).reshape(frame.height, plane.line_size)[
        :, : frame.width
    ]
    return untile(y, shape)


def encode_features(x: torch.Tensor, position: int, codec: str = "h264") -> EncodedFeatures:
    """Quantise one sample's feature map and compress it for the wire."""
    q = quantise(x.detach().cpu())
    arr = q.data.numpy()
    data = encode_uint8(arr) if codec == "h264" else arr.tobytes()
    return EncodedFeatures(position, tuple(x.shape), q.scale, q.zero_point, codec, data)


def decode_features(
    shape: Sequence[int], scale: float, zero_point: int, codec: str, data: bytes
) -> torch.Tensor:
    """The float feature map (dequantised) from its wire form; FeatureError if it does not fit."""
    if codec == "raw":
        need = math.prod(shape)
        if len(data) != need:
            raise FeatureError(
                f"raw data of {len(data)} bytes for shape {list(shape)} ({need} bytes)"
            )
        arr = np.frombuffer(data, dtype=np.uint8).reshape(tuple(shape))
    elif codec == "h264":
        arr = decode_uint8(data, shape)
    else:
        raise FeatureError(f"codec {codec!r} is not one of {', '.join(CODECS)}")
    q = Quantised(torch.from_numpy(arr.copy()), float(scale), int(zero_point))
    return dequantise(q)

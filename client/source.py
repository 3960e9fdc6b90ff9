"""What a camera hands the client: frames at the app's input size, each with its JPEG.

A source is a video file (decoded with PyAV; the project bundles one clip) or `synthetic`
(seeded noise over smooth gradients, for runs that need no file). The JPEG is made once per
frame (OpenCV), as a camera's encoder would, so sending a frame costs no client CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np

from client.frames import BUNDLED_VIDEO, jpeg, video_frames
from layerexec.images import resize_rgb
from layerexec.zoo import ModelSpec

SYNTHETIC = "synthetic"


@dataclass(frozen=True)
class Frame:
    index: int
    rgb: np.ndarray  # H x W x 3 uint8 at the model's input size
    jpeg: bytes


def load_frames(
    source: str | Path, spec: ModelSpec, limit: int = 120, seed: int = 0
) -> list[Frame]:
    """Up to `limit` frames of `source` (a video path, or "synthetic"), resized for `spec`;
    frames of a longer video are taken evenly spaced over it. ValueError names a bad source."""
    if str(source) == SYNTHETIC:
        rgbs = _synthetic(spec, limit, np.random.default_rng(seed))
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"{path}: no such video file (expected a video, or 'synthetic')")
        every = max(1, _frame_count(path) // limit)
        rgbs = [resize_rgb(f, spec) for f in video_frames(path, limit=limit, every=every)]
    return [Frame(i, rgb, jpeg(rgb)) for i, rgb in enumerate(rgbs)]


def _frame_count(path: Path) -> int:
    try:
        with av.open(str(path)) as container:
            return int(container.streams.video[0].frames)
    except (av.error.FFmpegError, IndexError, OSError):
        return 0  # unknown: video_frames says what is wrong


def _synthetic(spec: ModelSpec, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    _, h, w = spec.input_shape
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    out = []
    for i in range(n):
        phase = 2 * np.pi * i / max(n, 1)
        base = np.stack(
            [
                127 + 100 * np.sin(xx / w * 3 + phase),
                127 + 100 * np.cos(yy / h * 2 + phase),
                127 + 100 * np.sin((xx + yy) / (w + h) * 4 - phase),
            ],
            axis=-1,
        )
        noisy = base + rng.normal(0, 12, base.shape)
        out.append(np.clip(noisy, 0, 255).astype(np.uint8))
    return out


__all__ = ["BUNDLED_VIDEO", "SYNTHETIC", "Frame", "load_frames"]

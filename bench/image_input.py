"""A JPEG frame to a model's input, per stage of `server.inputs.image_tensor`: decode, resize,
and the per-channel normalisation done two ways side by side. Target: ratio (numpy / OpenCV
normalisation) well above 1; `layerexec.images.rgb_tensor` uses OpenCV's per-channel scalar ops,
which give the same float32 values. Every server in `bench/peers.py` decodes with this code, so
it is per-request work for all of them (on layerbatch's executor thread when torch has every core).

Side by side in one run: each repetition times every part over the bundled video's frames,
alternating which normalisation goes first. Reported: median ms per frame of each part over the
repetitions, and the median of the per-repetition ratios.

    .venv/bin/python bench/image_input.py [--model mobilenet_v2] [--reps 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import cv2
import numpy as np
import torch

from client.frames import jpeg, video_frames
from layerexec.images import resize_rgb, rgb_tensor
from layerexec.zoo import ModelSpec, spec


def numpy_normalise(rgb: np.ndarray, s: ModelSpec) -> torch.Tensor:
    """The numpy way: subtract the mean while converting to float32, then scale, broadcasting
    a 3-vector over the last axis (what `rgb_tensor` did before)."""
    out = np.subtract(rgb, np.asarray(s.pixel_mean, dtype=np.float32), dtype=np.float32)
    out *= 1.0 / np.asarray(s.pixel_std, dtype=np.float32)
    return torch.from_numpy(out).permute(2, 0, 1)


def per_frame_ms(fn: Callable[[Any], object], items: Sequence[Any], passes: int = 5) -> float:
    started = time.perf_counter()
    for _ in range(passes):
        for item in items:
            fn(item)
    return (time.perf_counter() - started) / (passes * len(items)) * 1000.0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)
    s = spec(args.model)
    frames = [jpeg(f) for f in video_frames(limit=40, every=10)]

    def decode(frame: bytes) -> np.ndarray:
        img = cv2.imdecode(np.frombuffer(frame, np.uint8), cv2.IMREAD_COLOR)
        assert img is not None, "a bundled frame did not decode"
        return img

    decoded = [decode(f) for f in frames]
    resized = [cv2.cvtColor(resize_rgb(img, s), cv2.COLOR_BGR2RGB) for img in decoded]
    for rgb in resized:  # the same values, so the two ways time the same work
        assert torch.equal(numpy_normalise(rgb, s), rgb_tensor(rgb, s))
    runs: dict[str, tuple[Callable[[Any], object], Sequence[Any]]] = {
        "imdecode": (decode, frames),
        "resize": (lambda img: resize_rgb(img, s), decoded),
        "normalise (numpy)": (lambda rgb: numpy_normalise(rgb, s), resized),
        "normalise (OpenCV, shipped)": (lambda rgb: rgb_tensor(rgb, s), resized),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    ratios = []
    for rep in range(args.reps):
        names = list(runs) if rep % 2 == 0 else [*list(runs)[:2], *reversed(list(runs)[2:])]
        for name in names:
            times[name].append(per_frame_ms(*runs[name]))
        ratios.append(times["normalise (numpy)"][-1] / times["normalise (OpenCV, shipped)"][-1])
    height, width = decoded[0].shape[:2]
    print(f"{args.model}, {len(frames)} frames of {width}x{height}, {args.reps} repetitions")
    print("median ms per frame:")
    for name, ms in times.items():
        print(f"  {name:30s} {statistics.median(ms):.3f}")
    print(f"ratio numpy / OpenCV normalisation: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()

"""Partial offload gives the user the same answer as running the whole model in fp32.

The partial path is what a client that offloads at split k and the server do together: stages
[0, k) in fp32, the stage-k input quantised to INT8 and compressed with lossless H.264
(`layerexec.features.encode_features`), decoded as the server decodes it
(`server.inputs.feature_tensor`), stages [k, N) in fp32, and the answer summarised as the server
answers (`server.results.describe`). At every legal split k in 1..N-1, on real inputs (40 frames
spread over the bundled video, 20 of them for UltraFace; the bundled photos; and crops, flips, a
darker and a smaller copy of the astronaut photo so that the face detector has faces to find),
it must agree with the fp32 path:

- ResNet-20 (CIFAR-10, real weights): the same top-1 class on >= 99% of (input, split) pairs;
- UltraFace slim-320 (real weights): the same number of face boxes, each fp32 box matched one to
  one by a box with IoU >= 0.9, on >= 99% of (input, split) pairs.

The measured figures are printed in the "figures" section of the pytest summary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat
from typing import Any

import cv2
import numpy as np
import pytest
import torch

from client.frames import bundled_photos, video_frames
from layerexec.zoo import StagedModel, load_model
from server.inputs import feature_tensor, rgb_tensor
from server.results import describe
from tests.server_cases import CIFAR, FACES, features_payload

VIDEO_FRAMES = 40
VIDEO_EVERY = 30  # the clip has 1189 frames (about 30 fps): one frame a second over its 40 s
MIN_AGREEMENT = 0.99
MIN_IOU = 0.9
ASTRONAUT = "skimage_astronaut.png"
CHUNK = 8  # samples per forward


def _on_canvas(rgb: np.ndarray, h: int, w: int, size: int, top: int, left: int) -> np.ndarray:
    """`rgb` resized to size x size and pasted on a grey h x w canvas (a small face)."""
    canvas = np.full((h, w, 3), 127, np.uint8)
    canvas[top : top + size, left : left + size] = cv2.resize(rgb, (size, size))
    return canvas


def _astronaut_variants(a: np.ndarray) -> dict[str, np.ndarray]:
    """Flips, crops, a darker copy and a small copy of the astronaut (512 x 512, face near
    rows 60..175, columns 175..275): the same face at other places, sizes and exposures."""
    variants = {
        "flipped": a[:, ::-1],
        "crop-300": a[0:300, 100:400],
        "crop-zoom": a[0:256, 96:352],
        "crop-240x320": a[20:260, 120:440],
        "crop-left": a[0:360, 0:480],
        "dark": (a * 0.6).astype(np.uint8),
        "small": _on_canvas(a, 240, 320, 128, 60, 40),
    }
    return {f"astronaut-{k}": np.ascontiguousarray(v) for k, v in variants.items()}


@pytest.fixture(scope="module")
def images() -> dict[str, np.ndarray]:
    """Every input, RGB uint8, by name: photos, astronaut variants, video frames."""
    photos = bundled_photos()
    frames = video_frames(limit=VIDEO_FRAMES, every=VIDEO_EVERY)
    assert len(frames) == VIDEO_FRAMES
    return {
        **photos,
        **_astronaut_variants(photos[ASTRONAUT]),
        **{f"frame-{i * VIDEO_EVERY}": f for i, f in enumerate(frames)},
    }


def _samples(out: Any, n: int) -> list[Any]:
    """One output per sample: rows of a tensor, or per-sample tuples (UltraFace's (scores,
    boxes))."""
    if isinstance(out, torch.Tensor):
        return list(out.unbind(0))
    assert isinstance(out, tuple), type(out)
    return list(zip(*(part.unbind(0) for part in out), strict=True))


def _run(model: StagedModel, x: torch.Tensor, k0: int, k1: int | None = None) -> Any:
    """Stages [k0, k1) on `x` in chunks of CHUNK samples, channels_last (as the server runs on a
    CPU; several times faster here than one large batch), outputs concatenated."""
    outs: list[Any] = [
        model.run(c.contiguous(memory_format=torch.channels_last) if c.dim() == 4 else c, k0, k1)
        for c in x.split(CHUNK)
    ]
    if isinstance(outs[0], torch.Tensor):
        return torch.cat(outs).contiguous()
    return tuple(torch.cat(parts) for parts in zip(*outs, strict=True))


def _answers(model: StagedModel, out: Any, n: int) -> list[dict[str, Any]]:
    return [describe(model.spec, o) for o in _samples(out, n)]


def _over_the_wire(x: torch.Tensor, k: int, shape: tuple[int, ...]) -> torch.Tensor:
    """One sample's stage-k input as the server receives it: INT8 + H.264 on the client
    (`encode_features`), then decoded and checked against the stage's shape on the server."""
    return feature_tensor(features_payload(x, k, "h264"), shape)


def _partial_answers(
    model: StagedModel, x: torch.Tensor
) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """(k, the answer per sample) for every split k in 1..N-1. The fp32 prefix is carried from
    one split to the next (stage k-1 once per k); each sample's stage-k input is encoded and
    decoded once (two threads: PyAV and torch release the GIL)."""
    n = x.shape[0]
    h: Any = x
    with ThreadPoolExecutor(2) as pool:
        for k in range(1, len(model.stages)):
            h = _run(model, h, k - 1, k)
            assert isinstance(h, torch.Tensor)
            shape = model.in_shapes[k]
            received = pool.map(_over_the_wire, h.unbind(0), repeat(k), repeat(shape))
            x_k = torch.stack(list(received))
            yield k, _answers(model, _run(model, x_k, k), n)


Batch = tuple[StagedModel, list[str], torch.Tensor]


@pytest.fixture(scope="module")
def batches(images: dict[str, np.ndarray]) -> Callable[[str, int], Batch]:
    """`batches(model, frame_stride)`: the model, the names of its inputs (every photo and
    variant, every `frame_stride`-th video frame) and their model inputs as one batch."""

    def make(name: str, frame_stride: int = 1) -> Batch:
        model = load_model(name)
        frames = [n for n in images if n.startswith("frame-")]
        names = [n for n in images if n not in frames] + frames[::frame_stride]
        return model, names, torch.stack([rgb_tensor(images[n], model.spec) for n in names])

    return make


def _listed(misses: list[str], most: int = 6) -> str:
    """A few of the (input, split) pairs that differ, for the report line."""
    if not misses:
        return ""
    more = f" and {len(misses) - most} more" if len(misses) > most else ""
    return f"; differs at {', '.join(misses[:most])}{more}"


def test_resnet20_partial_offload_keeps_the_top1(
    batches: Callable[[str, int], Batch], report: Callable[[str], None]
) -> None:
    model, names, x = batches(CIFAR, 1)
    full = [a["top5"][0]["class"] for a in _answers(model, _run(model, x, 0), len(x))]
    agree_by_k: dict[int, float] = {}
    misses: list[str] = []
    for k, answers in _partial_answers(model, x):
        same = [a["top5"][0]["class"] == c for a, c in zip(answers, full, strict=True)]
        agree_by_k[k] = sum(same) / len(same)
        misses += [f"{names[i]}@k={k}" for i, s in enumerate(same) if not s]
    pairs = len(names) * len(agree_by_k)
    agreement = 1 - len(misses) / pairs
    worst = min(agree_by_k, key=lambda k: agree_by_k[k])
    report(
        f"partial fidelity {CIFAR}: top-1 agreement {agreement:.3f} over {pairs} (input, split) "
        f"pairs ({len(names)} inputs x splits 1..{len(model.stages) - 1}; worst split "
        f"k={worst} at {agree_by_k[worst]:.3f}){_listed(misses)}"
    )
    assert len(set(full)) > 1, "the inputs should not all get the same class"
    assert agreement >= MIN_AGREEMENT, f"top-1 differs from fp32 at {misses}"


def _iou(a: list[float], b: list[float]) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(w, 0.0) * max(h, 0.0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _matched_ious(ref: list[dict[str, Any]], got: list[dict[str, Any]]) -> list[float] | None:
    """The IoU of each reference box with its match (one to one, best first), or None when the
    counts differ or a reference box has no partner of IoU >= MIN_IOU."""
    if len(ref) != len(got):
        return None
    free = [g["box"] for g in got]
    ious = []
    for r in ref:
        best = max(range(len(free)), key=lambda j: _iou(r["box"], free[j]))
        iou = _iou(r["box"], free.pop(best))
        if iou < MIN_IOU:
            return None
        ious.append(iou)
    return ious


def test_ultraface_partial_offload_keeps_the_boxes(
    batches: Callable[[str, int], Batch], report: Callable[[str], None]
) -> None:
    # every other video frame (the clip shows no faces; they check that no box appears), every
    # photo and astronaut variant: 15 splits cost about 25 ms per input here
    model, names, x = batches(FACES, 2)
    full = [a["boxes"] for a in _answers(model, _run(model, x, 0), len(x))]
    assert full[names.index(ASTRONAUT)], "fp32 UltraFace should find the astronaut's face"
    with_faces = [name for name, boxes in zip(names, full, strict=True) if boxes]
    misses: list[str] = []
    ious: list[float] = []
    splits = 0
    for k, answers in _partial_answers(model, x):
        splits += 1
        for i, a in enumerate(answers):
            matched = _matched_ious(full[i], a["boxes"])
            if matched is None:
                misses.append(f"{names[i]}@k={k}: {full[i]} vs {a['boxes']}")
            else:
                ious += matched
    pairs = len(names) * splits
    agreement = 1 - len(misses) / pairs
    report(
        f"partial fidelity {FACES}: same boxes (count, IoU >= {MIN_IOU}) {agreement:.3f} over "
        f"{pairs} (input, split) pairs ({len(names)} inputs x splits 1..{splits}); fp32 finds "
        f"{sum(map(len, full))} boxes on {len(with_faces)} inputs; matched box IoU min "
        f"{min(ious, default=float('nan')):.3f}, mean {np.mean(ious) if ious else float('nan'):.3f}"
        f"{_listed([m.split(':')[0] for m in misses])}"
    )
    assert len(with_faces) >= 5, f"too few inputs with faces to test: {with_faces}"
    assert agreement >= MIN_AGREEMENT, f"boxes differ from fp32 at {misses}"

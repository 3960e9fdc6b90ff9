"""What an answer says about a model's output: top-5 classes for a classifier, boxes with scores
for a detector, a class histogram for a segmentation map. Runs on the server's event loop, so on
small tensors only, or numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torchvision.ops import nms

from layerexec.zoo import ModelSpec

TOP_K = 5
MAX_BOXES = 20
FACE_SCORE = 0.7
FACE_IOU = 0.3


def describe(spec: ModelSpec, output: Any) -> dict[str, Any]:
    """A JSON-able summary of one request's final output."""
    if spec.kind == "classifier":
        return {"top5": _top(spec, output)}
    if spec.kind == "segmenter":
        return {"class_pixels": _histogram(spec, output)}
    if spec.kind == "detector":
        return {"boxes": _detections(spec, output)}
    return {"boxes": _faces(spec, output)}


def is_finite(output: Any) -> bool:
    """Whether every number of a model's output (a tensor, or a dict or tuple of them) is finite;
    numpy, not torch, as `_histogram`."""
    if isinstance(output, torch.Tensor):
        return bool(np.isfinite(output.detach().cpu().numpy()).all())
    if isinstance(output, dict):
        return all(is_finite(v) for v in output.values())
    if isinstance(output, tuple | list):
        return all(is_finite(v) for v in output)
    return True


def _label(spec: ModelSpec, i: int) -> str:
    return spec.labels[i] if 0 <= i < len(spec.labels) else str(i)


def _top(spec: ModelSpec, logits: torch.Tensor) -> list[dict[str, Any]]:
    p = torch.softmax(logits.float().flatten(), 0)
    scores, idx = p.topk(min(TOP_K, p.numel()))
    # two tolist calls, not one conversion per element: half the time of an answer's summary
    return [
        {"class": i, "label": _label(spec, i), "score": round(s, 5)}
        for s, i in zip(scores.tolist(), idx.tolist(), strict=True)
    ]


def _histogram(spec: ModelSpec, out: torch.Tensor) -> dict[str, int]:
    # numpy, not torch: a map this large would start torch's parallel threads on the event
    # loop's thread (layerexec.torch_thread)
    classes = np.argmax(out.cpu().numpy(), axis=0).ravel()
    counts = np.bincount(classes, minlength=out.shape[0])
    return {_label(spec, i): int(c) for i, c in enumerate(counts.tolist()) if c}


def _detections(spec: ModelSpec, det: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    order = det["scores"].argsort(descending=True)[:MAX_BOXES]
    return [
        {
            "box": [round(float(v), 1) for v in det["boxes"][i]],
            "score": round(float(det["scores"][i]), 5),
            "label": _label(spec, int(det["labels"][i])),
        }
        for i in order
    ]


def _faces(spec: ModelSpec, out: tuple[torch.Tensor, torch.Tensor]) -> list[dict[str, Any]]:
    scores, boxes = out[0][:, 1].float(), out[1].float()
    keep = scores > FACE_SCORE
    scores, boxes = scores[keep], boxes[keep]
    _, h, w = spec.input_shape
    pixels = boxes * torch.tensor([w, h, w, h], dtype=boxes.dtype)
    kept = nms(pixels, scores, FACE_IOU)[:MAX_BOXES]
    return [
        {"box": [round(float(v), 1) for v in pixels[i]], "score": round(float(scores[i]), 5)}
        for i in kept
    ]

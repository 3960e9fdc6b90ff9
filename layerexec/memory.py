"""Activation memory: a stage's peak per sample, and the batch bound B a memory budget allows.

peak_activation_bytes(stage, x): run the stage node by node (torch.fx) and track the bytes of the
tensors alive at each step: the input, every intermediate until its last use, the output. The
maximum, divided by the batch size, is the stage's peak per sample. (Weights are not counted: they
are loaded once whatever the batch. A stage that is not an fx graph counts its input and output.)

batch_bound(peaks, budget): the largest b with b * max_k peak_k <= budget, capped at `cap`
(paper 003 section 4.1: B from the memory left for activations).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn


def nbytes(value: Any) -> int:
    """Bytes of the tensors in a value (tensors, lists, tuples, dicts of them)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    return 0


def peak_activation_bytes(stage: nn.Module, x: torch.Tensor) -> tuple[int, Any]:
    """(peak bytes alive while running `stage` on the batch `x`, the stage's output)."""
    if not isinstance(stage, fx.GraphModule):
        with torch.inference_mode():
            out = stage(x)
        return nbytes(x) + nbytes(out), out
    nodes = list(stage.graph.nodes)
    last_use = {n: max((nodes.index(u) for u in n.users), default=-1) for n in nodes}
    alive: dict[fx.Node, int] = {}
    peak = 0

    class Tracker(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            nonlocal peak
            out = super().run_node(n)
            if n.op not in ("get_attr", "output"):
                alive[n] = nbytes(out)
            peak = max(peak, sum(alive.values()))
            i = nodes.index(n)
            for m in [m for m in alive if last_use[m] <= i and m is not n]:
                del alive[m]
            return out

    with torch.inference_mode():
        out = Tracker(stage).run(x)
    return peak, out


def batch_bound(peak_bytes_per_sample: Sequence[int], budget_bytes: int, cap: int) -> int:
    """Largest batch whose activation peak fits the budget at every stage, at most `cap`;
    0 if not even one sample fits."""
    worst = max(peak_bytes_per_sample, default=0)
    if worst <= 0:
        return cap
    return max(0, min(cap, budget_bytes // worst))

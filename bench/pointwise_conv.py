"""1x1 convolutions routed to oneDNN against torch's own pick, on one torch thread, per batch size.

Target: routed faster than torch's pick below batch 16 on a model with many 1x1 convolutions
(mobilenet_v2, googlenet), about 1 at batch 1 and from 16 on, where torch already picks oneDNN
(`layerexec.pointwise`). Side by side in one run: the model is loaded twice as the server loads
it (batch norms folded, channels-last, stages as TorchScript), once with its 1x1 convolutions
routed (`zoo.load_model`'s default) and once with them put back to `nn.Conv2d`; each batch size
is timed on both in turn, alternating which goes first, for --seconds each, --reps times.
Reported: ms a sample of each (the best of the reps), the ratio torch's pick / routed (above 1:
routing is faster), and the largest difference of their outputs relative to the output's size.

    .venv/bin/python bench/pointwise_conv.py [--models mobilenet_v2,googlenet,resnet18]
        [--batches 1,2,4,8,12,15,16] [--seconds 1] [--reps 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: the repository root, for `layerexec`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from layerexec.pointwise import OneDnnPointwise
from layerexec.script import script_stages
from layerexec.zoo import StagedModel, load_model


def loaded(model: str, routed: bool) -> StagedModel:
    """`model` as the server runs it, its 1x1 convolutions routed to oneDNN or not."""
    m = load_model(model)
    if not routed:
        for part in (m.module, *m.stages):
            for conv in [c for c in part.modules() if type(c) is OneDnnPointwise]:
                conv.__class__ = nn.Conv2d  # type: ignore[assignment]  # torch's own pick back
    return script_stages(m.to("cpu", channels_last=True), channels_last=True)


def ms_per_sample(m: StagedModel, x: torch.Tensor, seconds: float) -> float:
    m.run(x)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        m.run(x)
        n += 1
    return (time.perf_counter() - t0) / n / x.shape[0] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--models", default="mobilenet_v2,googlenet,resnet18")
    ap.add_argument("--batches", default="1,2,4,8,12,15,16")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    try:
        batches = [int(b) for b in a.batches.split(",")]
    except ValueError:
        raise SystemExit(
            f"--batches: expected a comma list of batch sizes, got {a.batches!r}"
        ) from None
    if min(batches) < 1 or a.seconds <= 0 or a.reps < 1:
        raise SystemExit(
            f"--batches, --seconds, --reps: expected positive batch sizes, time and count, got "
            f"{a.batches}, {a.seconds:g}, {a.reps}"
        )
    torch.set_num_threads(1)
    sides = ("torch's pick", "routed")
    for model in a.models.split(","):
        ms = {side: loaded(model, side == "routed") for side in sides}
        print(f"{model}, one torch thread, ms a sample:", flush=True)
        for b in batches:
            x = torch.rand(
                b, *ms["routed"].spec.input_shape, generator=torch.Generator().manual_seed(b)
            )
            x = x.contiguous(memory_format=torch.channels_last)
            best = {side: float("inf") for side in sides}
            with torch.inference_mode():
                for rep in range(a.reps):
                    for side in sides if rep % 2 == 0 else sides[::-1]:
                        best[side] = min(best[side], ms_per_sample(ms[side], x, a.seconds))
                want, got = ms[sides[0]].run(x), ms[sides[1]].run(x)
            assert isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor)
            diff = float((got - want).abs().max() / (want.abs().max() or 1.0))
            print(
                f"  batch {b:3d}: "
                + ", ".join(f"{side} {best[side]:6.2f}" for side in sides)
                + f"; {sides[0]} / routed {best[sides[0]] / best['routed']:.2f}"
                + f" (outputs differ by {diff:.1e} of their size)",
                flush=True,
            )


if __name__ == "__main__":
    main()

"""What folding batch norm into the convolutions at load gains (`zoo.load_model(fold_batch_norm=)`,
the server's default; `layerbatch serve --no-fold-bn` turns it off).

Side by side in one run: each repetition times a forward of the model as defined and of the
folded model on the same batch, back to back in alternating order, and the ratio reported is the
median of the per-repetition ratios folded / plain (this machine's speed drifts by tens of
percent from second to second; the pairing cancels most of it). Both run channels-last under
inference mode with the same thread count, as the executor runs them; the outputs are checked to
agree (max |difference| relative to max |output|).

    .venv/bin/python bench/fold_batch_norm.py [--models resnet18,mobilenet_v2,googlenet]
        [--batches 1,4,8] [--runs 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from layerexec.zoo import StagedModel, load_model


def forward_ms(m: StagedModel, x: torch.Tensor) -> float:
    t0 = time.perf_counter()
    m.run(x)
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--models", default="resnet18,mobilenet_v2,googlenet")
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"folded vs plain forward, {args.threads} threads, medians of {args.runs} (ms)")
    print(
        f"{'model':<14} {'batch':>5} {'plain':>8} {'folded':>8} {'ratio':>6} {'max rel diff':>12}"
    )
    for name in args.models.split(","):
        plain = load_model(name, fold_batch_norm=False).to("cpu", channels_last=True)
        folded = load_model(name, fold_batch_norm=True).to("cpu", channels_last=True)
        for batch in (int(b) for b in args.batches.split(",")):
            x = torch.rand(
                batch, *plain.spec.input_shape, generator=torch.Generator().manual_seed(0)
            )
            x = x.contiguous(memory_format=torch.channels_last)
            a, b = plain.run(x), folded.run(x)
            assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            rel = float((a - b).abs().max() / a.abs().max().clamp_min(1e-12))
            times: dict[str, list[float]] = {"plain": [], "folded": []}
            ratios = []
            for rep in range(args.runs + 2):
                pair = {}
                for side in ("plain", "folded") if rep % 2 else ("folded", "plain"):
                    pair[side] = forward_ms(plain if side == "plain" else folded, x)
                if rep >= 2:  # warm-up
                    for side, ms in pair.items():
                        times[side].append(ms)
                    ratios.append(pair["folded"] / pair["plain"])
            p, f = statistics.median(times["plain"]), statistics.median(times["folded"])
            print(
                f"{name:<14} {batch:>5} {p:>8.2f} {f:>8.2f} {statistics.median(ratios):>6.3f} "
                f"{rel:>12.1e}",
                flush=True,
            )


if __name__ == "__main__":
    main()

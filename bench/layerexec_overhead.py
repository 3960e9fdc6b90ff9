"""What running a model through the executor costs, against plain forwards (paper 003 section 6.1:
"its Batch=1 version ... takes only 3 ms longer"). Target: ratio <= 1.05.

Side by side in one run: each repetition times a plain forward and the executor back to back
(in alternating order), and the ratio reported is the median of the per-repetition ratios, which
cancels most of this machine's drift (its speed varies by tens of percent from second to second).
Times shown are medians over --runs:
  1. batch 1: the whole model stage by stage through `Executor.run` (gather, one exit check per
     stage, scatter) against one plain forward of the model;
  2. batch 8: 8 separately admitted requests gathered into one batch by the executor against a
     plain forward of the same batch of 8.
Both sides use the same memory layout (channels_last) and thread count.

    .venv/bin/python bench/layerexec_overhead.py [--models resnet18,mobilenet_v2] [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from layerexec.executor import Executor
from layerexec.zoo import load_model
from scheduler import Action, Deployment, parse_profile


def flat_profile(name: str, stages: int, shape: tuple[int, ...]) -> object:
    """A placeholder profile: the executor needs the stage count, not latencies."""
    return parse_profile(
        {
            "format": "layerbatch.profile/1",
            "model": name,
            "device": "bench",
            "input": {"shape": list(shape), "dtype": "float32"},
            "batch_sizes": [1],
            "stages": [{"name": f"s{k}", "latency_ms": [1.0]} for k in range(stages)],
            "max_batch": 64,
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet18,mobilenet_v2,googlenet")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"executor vs plain forward, {args.threads} threads, medians of {args.runs} (ms)")
    print(
        f"{'model':<14} {'stages':>6} {'b1 plain':>9} {'b1 exec':>8} {'ratio':>6} {'b8 plain':>9} {'b8 exec':>8} {'ratio':>6}"
    )
    for name in args.models.split(","):
        m = load_model(name)
        d = Deployment([flat_profile(name, len(m.stages), m.spec.input_shape)])  # type: ignore[list-item]
        ex = Executor(d, {name: m}, channels_last=True)
        n = len(m.stages)
        never = lambda: False  # noqa: E731  exit checks on, never firing
        row = []
        for batch in (1, 8):
            x = torch.rand(batch, *m.spec.input_shape).contiguous(memory_format=torch.channels_last)
            plain, via, ratios = [], [], []
            for rep in range(args.runs + 2):
                ids = tuple(f"{rep}-{i}" for i in range(batch))
                for i, rid in enumerate(ids):
                    ex.admit(rid, name, 0, x[i])
                pair = {}
                for side in ("plain", "exec") if rep % 2 else ("exec", "plain"):
                    t0 = time.perf_counter()
                    if side == "plain":
                        with torch.inference_mode():
                            m.module(x)
                    else:
                        ex.run(Action(name, (0, n), ids), cancel=never)
                    pair[side] = (time.perf_counter() - t0) * 1e3
                if rep >= 2:  # warm-up
                    plain.append(pair["plain"])
                    via.append(pair["exec"])
                    ratios.append(pair["exec"] / pair["plain"])
            row += [statistics.median(plain), statistics.median(via), statistics.median(ratios)]
        print(
            f"{name:<14} {n:>6} {row[0]:>9.2f} {row[1]:>8.2f} {row[2]:>6.3f} {row[3]:>9.2f} {row[4]:>8.2f} {row[5]:>6.3f}"
        )


if __name__ == "__main__":
    main()

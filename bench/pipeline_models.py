"""What the exact LP-bound screening gains on several models' pipeline plans
(`scheduler.pipeline.shares.solve_screened_models`; `plan_models(prune=False)` is the plain MILP).

Side by side in one run: per instance, the screened and the plain solve of the same candidates,
in alternating order over the repetitions; the ratio reported is the median of the per-repetition
ratios plain / screened. Both must find the same t (within the MIP gap): the screening is exact.
Candidates are enumerated once per instance and shared (their time is the same for both).

    .venv/bin/python bench/pipeline_models.py [--runs 1] [--slow] [--out FILE.json]

Without --slow it skips the instance whose plain solve takes about two minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from scheduler.pipeline.cluster import Cluster
from scheduler.pipeline.milp import candidates_or_refusal, solve_candidates
from scheduler.pipeline.profiles import load_model_profiles
from scheduler.pipeline.shares import solve_screened_models

CLOUD = Path(__file__).resolve().parent.parent / "traces" / "data" / "profiles" / "cloud"
# (models, SLO ms per model, L4, T4, margin, slow): equal shares, P = 3, MPS up to 4
INSTANCES: list[tuple[tuple[str, ...], tuple[float, ...], int, int, float, bool]] = [
    (("cyclegan", "repvgg-b3"), (100.0, 100.0), 4, 4, 0.1, False),
    (("cyclegan", "repvgg-b3"), (200.0, 200.0), 4, 4, 0.1, True),
    (("resnext152-32x4d_8xb32_in1k", "tf_efficientdet_d1"), (0.0, 0.0), 3, 3, 0.1, False),
    (("repvgg-b3", "googlenet-v3-pytorch"), (0.0, 0.0), 1, 3, 0.1, False),
]
SLO_X = 6.0  # an SLO of 0.0 above: SLO_X times the model's batch-1 latency on one L4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=1, help="repetitions per instance")
    ap.add_argument("--slow", action="store_true", help="also the two-minute instance")
    ap.add_argument("--out", default=None, help="write the rows as JSON")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    print("instance | candidates | plain s | screened s | plain / screened | same t")
    for names, slos, l4, t4, margin, slow in INSTANCES:
        if slow and not args.slow:
            continue
        cluster = Cluster.from_json(
            {
                "gpus": {
                    "L4": {"count": l4, "per_server": 4},
                    "T4": {"count": t4, "per_server": 2},
                },
                "nic_gbps": 10,
            }
        )
        groups, slo_list = [], []
        for name, slo in zip(names, slos, strict=True):
            prof = load_model_profiles(
                CLOUD / "ppipe", name, gpus=["L4", "T4"],
                transfer_dir=CLOUD / "ppipe-transfer-sizes",
            )  # fmt: skip
            slo_ms = slo or SLO_X * prof.partition_latency_ms("L4", 1, 0, prof.num_blocks, 1)
            slo_list.append(round(slo_ms, 1))
            groups.append(candidates_or_refusal(prof, cluster, slo_ms, margin, 3, 4, "ppipe"))
        shares = [1.0 / len(groups)] * len(groups)
        times: dict[str, list[float]] = {"plain": [], "screened": []}
        values: dict[str, float] = {}
        for run in range(args.runs):
            order = ["plain", "screened"] if run % 2 == 0 else ["screened", "plain"]
            for kind in order:
                t0 = time.perf_counter()
                if kind == "plain":
                    result = solve_candidates(groups, cluster, shares, None, 1e-4)
                else:
                    result = solve_screened_models(groups, cluster, shares, None, 1e-4)
                times[kind].append(time.perf_counter() - t0)
                values[kind] = result.normalized_rps
        ratio = statistics.median(
            p / s for p, s in zip(times["plain"], times["screened"], strict=True)
        )
        same = abs(values["plain"] - values["screened"]) <= 2e-4 * values["plain"]
        label = f"{'+'.join(n.split('_')[0] for n in names)} at {slo_list} ms, {l4} L4 + {t4} T4"
        count = sum(len(g) for g in groups)
        plain_s, screened_s = (
            statistics.median(times["plain"]),
            statistics.median(times["screened"]),
        )
        print(f"{label} | {count} | {plain_s:.1f} | {screened_s:.1f} | {ratio:.2f}x | {same}")
        rows.append(
            {
                "models": list(names), "slo_ms": slo_list, "L4": l4, "T4": t4, "candidates": count,
                "plain_s": plain_s, "screened_s": screened_s, "ratio": ratio,
                "t_plain": values["plain"], "t_screened": values["screened"], "same_t": same,
            }
        )  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

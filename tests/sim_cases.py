"""Shared helpers for the traces / profile / sim / engine / CLI tests.

Everything here is plain data or an independent re-implementation used as an oracle: the plan
replay below reads the profile JSON directly (measured latencies only) instead of going through
`scheduler.timeline`, so a CLI test that replays a plan does not trust the code it checks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHIPPED_PROFILES = REPO / "traces" / "data" / "profiles"
AZURE_TRACE = REPO / "traces" / "data" / "request_traces" / "AzureLLMInferenceTrace_code.csv"
# ../shared exists on the development machines only (CI has a bare clone).
SHARED = REPO.parent / "shared"
PPIPE_TIMING = SHARED / "data" / "profiles" / "ppipe" / "block-timing-tf32"

GOOGLENET = "googlenet-v3-pytorch"
GOOGLENET_V100 = SHIPPED_PROFILES / "googlenet-v3-pytorch-V100.json"
REPVGG = "repvgg-b3"
REPVGG_V100 = SHIPPED_PROFILES / "repvgg-b3-V100.json"

# The issue's `layerbatch sim --json` keys (the document may carry more).
SIM_KEYS = (
    "policy",
    "rate_rps",
    "requests",
    "completed",
    "dropped",
    "on_time_ratio",
    "mean_ms",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "queue_ms_mean",
    "in_steps_ms_mean",
    "mean_batch",
    "plan_us_p50",
    "plan_us_p99",
)


def profile_doc(
    latencies: Sequence[Sequence[float]],
    batch_sizes: Sequence[int] = (1, 2),
    max_batch: int = 4,
    model: str = "m",
) -> dict[str, Any]:
    """A valid `layerbatch.profile/1` document: one stage per row of `latencies`."""
    return {
        "format": "layerbatch.profile/1",
        "model": model,
        "device": "test-device",
        "input": {"shape": [3, 8, 8], "dtype": "float32"},
        "batch_sizes": list(batch_sizes),
        "stages": [
            {"name": f"s{k}", "latency_ms": list(row), "out_shape": None, "out_bytes": 0}
            for k, row in enumerate(latencies)
        ],
        "max_batch": max_batch,
    }


def write_json(path: Path, doc: object) -> Path:
    path.write_text(json.dumps(doc))
    return path


def googlenet_sim_args(rate_rps: float) -> list[str]:
    """`layerbatch sim` on the V100 googlenet profile under dp-tardy at `rate_rps`: 300 Poisson
    requests, 150 ms deadline, seed 3, JSON out."""
    return ["sim", "--profile", "googlenet-v3-pytorch-V100", "--policy", "dp-tardy",
            "--rate", f"{rate_rps:g}", "--requests", "300", "--deadline-ms", "150",
            "--seed", "3", "--json"]  # fmt: skip


def cli_json(capsys: Any, args: Sequence[str]) -> dict[str, Any]:
    """`layerbatch ARGS` run in-process: it exits 0; its JSON output, parsed."""
    import layerbatch

    assert layerbatch.main(list(args)) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def read_profile_doc(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def chain_offsets(
    apps: Mapping[str, Sequence[str]], stage_counts: Mapping[str, int]
) -> dict[str, dict[str, tuple[int, int]]]:
    """app -> model -> (offset, offset + stages) over the app's chain."""
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for app, models in apps.items():
        offset = 0
        out[app] = {}
        for m in models:
            out[app][m] = (offset, offset + stage_counts[m])
            offset += stage_counts[m]
    return out


def replay_plan_doc(
    plan: Mapping[str, Any],
    requests: Sequence[Mapping[str, Any]],
    now_ms: float,
    profiles: Mapping[str, Mapping[str, Any]],
    apps: Mapping[str, Sequence[str]],
) -> dict[str, float]:
    """Run the plan document's actions back to back from `now_ms`, with the measured latency of
    each stage at the action's batch size (read straight from the profile JSON; batches must be
    measured sizes). Asserts every plan guarantee on the way; returns each request's completion."""
    counts = {m: len(p["stages"]) for m, p in profiles.items()}
    offsets = chain_offsets(apps, counts)
    app_of = {r["id"]: r["app"] for r in requests}
    pos = {r["id"]: r.get("position", 0) for r in requests}
    dropped = set(plan["dropped"])
    done: dict[str, float] = {}
    t = now_ms
    for act in plan["actions"]:
        model = act["model"]
        k0, k1 = act["stages"]
        assert 0 <= k0 < k1 <= counts[model], f"stages {act['stages']} outside {model}"
        batch = len(act["requests"])
        sizes = profiles[model]["batch_sizes"]
        assert batch in sizes, f"batch {batch} is not a measured size of {model}"
        for rid in act["requests"]:
            assert rid not in done and rid not in dropped
            lo, _ = offsets[app_of[rid]][model]
            assert pos[rid] == lo + k0, f"{rid} at {pos[rid]} does not stand at {model}[{k0}]"
        idx = sizes.index(batch)
        duration = sum(profiles[model]["stages"][k]["latency_ms"][idx] for k in range(k0, k1))
        start = max(t, act.get("not_before_ms", t))
        t = start + duration
        for rid in act["requests"]:
            pos[rid] += k1 - k0
            app_models = apps[app_of[rid]]
            if pos[rid] >= offsets[app_of[rid]][app_models[-1]][1]:
                done[rid] = t
    missing = set(app_of) - dropped - set(done)
    assert not missing, f"requests never finished: {sorted(missing)}"
    return done

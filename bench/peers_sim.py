"""What the scheduling alone buys over the peers' batchers, in the simulator, under the very
arrivals bench/peers.py sends (issue 9).

bench/peers.py compares servers that differ in everything at once: how they schedule, but also how
fast they run a batch, what else runs beside torch on the two cores, and the machine's speed as it
drifts. This takes the first apart. The simulator runs each policy on the same CPU profile
(`MODEL-cpu`: the shipped two-thread one, what layerbatch's server plans with, or those in
`--profiles`; `--time-scale` multiplies it), on one device or
`--replicas` of them (a request joining the one with the least work left), every admitted request
costing `--decode-ms` of device time before the device's next step (the servers decode on the cores
torch uses; this is how layerbatch's server with 2 replicas on 2 cores decodes,
`simulate(decode_ms=...)`, its plans counting the decode in the first stage), batches of at most
`--max-batch`, with the arrivals of bench/peers.py: Poisson (`--requests` of them, seeded as there)
or the Azure code trace's first `--trace-requests` arrivals rescaled to the rate. dp-tardy
(layerbatch's default) runs against whole-model batching: `dynamic` (Triton's and Ray Serve's
batchers with no delay: whenever the device is free, the oldest waiting requests, up to B, through
the whole model), `nexus` and `tfs` (batches that wait as long as the deadline allows). Every
policy's batches take exactly their profiled time, so dp-tardy's crossing of 0.9 over the best
other's is the gain of the scheduling alone: where it is below 1.3x, the issue's target needs a
faster batch, not a better plan. dp-tardy keeps the server's door (`scheduler.admission`: a request
with no room within its deadline, or within `--admission-share` of it while its queue is
overloaded, is turned away on arrival); the peers' batchers turn nobody away, as the peers do not.

Rates grow geometrically (x1.1) from a fraction of the compute bound (replicas x 1000 / (decode +
batch-1 latency)) until every policy is below 0.9 at two rates in a row; crossings are interpolated
as in bench/peers.py. Runs in the project's venv, about 3 minutes for everything:

    .venv/bin/python bench/peers_sim.py [--models resnet18] [--arrivals azure] [--deadlines 300]

Prints the crossings and ratios; writes bench/results/peers-sim.json and the PNG beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root, for `bench.peers`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.peers_arrivals import AZURE_TRACE, ROOT, arrivals_for
from bench.peers_crossing import THRESHOLD, threshold_crossing
from bench.peers_report import crossings
from bench.peers_settings import MODELS
from bench.peers_table import plot
from scheduler import Deployment, load_profile, make_policy
from scheduler.admission import ADMISSION_SHARE
from scheduler.profile import scaled
from scheduler.types import App
from server.build import BUNDLED_PROFILES, profile_path
from sim.metrics import summarise
from sim.simulator import simulate
from sim.workload import Workload
from traces.arrivals import load_timestamps

POLICIES = ("dp-tardy", "dynamic", "nexus", "tfs")
STEP = 1.1  # rate grid: each rate this times the one before
START = {"poisson": 0.3, "azure": 0.05}  # the first rate, as a fraction of the compute bound
DECODE_MS = 2.0  # what the server measures for the benchmark's JPEGs here (decode_ms, 1.8-2.6 ms)


def deployment(
    model: str, max_batch: int, time_scale: float = 1.0, profiles: Path = BUNDLED_PROFILES
) -> Deployment:
    """`model` alone on its CPU profile in `profiles` (the shipped one by default), every
    latency times `time_scale`."""
    profile = scaled(load_profile(profile_path(profiles, model)), time_scale)
    return Deployment([profile], [App(model, (profile.model,))], max_batch)


def profile_bound_rps(d: Deployment, decode_ms: float) -> float:
    """1000 / (decode + batch-1 latency of the whole model), from the profile."""
    profile = next(iter(d.profiles.values()))
    return 1000.0 / (decode_ms + sum(stage.latency_ms[0] for stage in profile.stages))


def workload(
    model: str, arrival: str, rate: float, deadline_ms: float, n: int, seed: int, trace: Any
) -> Workload:
    """bench/peers.py's arrivals at `rate` (`arrivals_for`), all for `model`'s app."""
    arrivals_ms = arrivals_for(arrival, rate, n / rate, seed, trace, n) * 1000.0
    times = tuple(float(t) for t in arrivals_ms)
    return Workload(times, (model,) * len(times), deadline_ms, rate)


def sweep(
    d: Deployment,
    model: str,
    arrival: str,
    deadline_ms: float,
    n: int,
    seed: int,
    trace: Any,
    policies: Sequence[str] = POLICIES,
    max_rates: int = 80,
    admission_share: float | None = ADMISSION_SHARE,
    decode_ms: float = DECODE_MS,
    replicas: int = 1,
    overrun: float = 1.0,
) -> dict[str, dict[float, float]]:
    """Each policy's on-time ratio by rate, over the grid in the module docstring, on
    `replicas` devices running every step `overrun` times its profile, each admitted request's
    decode costing its device `decode_ms`, behind
    the server's door at `admission_share` (None: every request joins), which judges only the
    policies that drop late requests (`DROPS_LATE`: dp-tardy) and lets the rest through."""
    rate = START[arrival] * replicas * profile_bound_rps(d, decode_ms)
    out: dict[str, dict[float, float]] = {p: {} for p in policies}
    below = 0
    for _ in range(max_rates):
        w = workload(model, arrival, rate, deadline_ms, n, seed, trace)
        key = round(rate, 2)
        for p in policies:
            run = simulate(
                d, make_policy(p), w, admission_share=admission_share, decode_ms=decode_ms,
                replicas=replicas, overrun=overrun,
            )  # fmt: skip
            out[p][key] = float(summarise(run)["on_time_ratio"])
        below = below + 1 if all(out[p][key] < THRESHOLD for p in policies) else 0
        if below == 2:
            break
        rate *= STEP
    return out


def results(
    model: str, arrival: str, deadline_ms: float, on_time: dict[str, dict[float, float]]
) -> list[dict[str, Any]]:
    """One row per policy, in bench/peers.py's result form (`plot` draws them)."""
    rows = []
    for policy, per in on_time.items():
        capacity, crossing = threshold_crossing(per)
        rows.append(
            {
                "server": policy,
                "model": model,
                "deadline_ms": deadline_ms,
                "arrival": f"{arrival}, simulated",
                "knobs": "layerbatch" if policy == "dp-tardy" else "whole-model batching",
                "capacity_rps": capacity,
                "crossing_rps": crossing,
                "runs": {f"{r:g}": {"on_time_ratio": v} for r, v in per.items()},
            }
        )
    return rows


def gain(rows: Sequence[dict[str, Any]]) -> float | None:
    """dp-tardy's crossing (or capacity) over the best other policy's."""
    at = crossings(rows)
    best = max((v for p, v in at.items() if p != "dp-tardy"), default=0.0)
    return round(at["dp-tardy"] / best, 2) if best and at.get("dp-tardy") else None


def admission_share(text: str) -> float | None:
    """`--admission-share`: off, or a share of the deadline in (0, 1]."""
    if text == "off":
        return None
    try:
        share = float(text)
    except ValueError:
        share = float("nan")
    if not 0 < share <= 1:
        raise argparse.ArgumentTypeError(
            f"expected off or a share of the deadline in (0, 1], got {text!r}"
        )
    return share


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--arrivals", default="poisson,azure", help="poisson, azure or both")
    ap.add_argument("--deadlines", default="300,1000", help="ms, comma list")
    ap.add_argument(
        "--decode-ms", type=float, default=DECODE_MS, help="device time per request, at least 0"
    )
    ap.add_argument("--max-batch", type=int, default=8, help="every policy's largest batch")
    ap.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="devices for every policy, a request joining the one with the least work left "
        "(layerbatch's --replicas, the peers' workers; default 1)",
    )
    ap.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="every profiled latency times this (a one-thread replica here runs 1.4-1.95x the "
        "shipped two-thread profile, peers-log session 42; default 1)",
    )
    ap.add_argument(
        "--overrun",
        type=float,
        default=1.0,
        help="every step runs this times its profile while the plans count the profile (a "
        "server's steps ran 1.05-1.06x their plan, peers-log session 84; default 1)",
    )
    ap.add_argument(
        "--profiles",
        type=Path,
        default=BUNDLED_PROFILES,
        help="the folder of MODEL-cpu.json profiles to run on (default: the shipped two-thread "
        "ones; `layerbatch profile --threads 1` measures the one-thread replicas' own)",
    )
    ap.add_argument("--requests", type=int, default=1000, help="Poisson requests per rate")
    ap.add_argument("--trace-requests", type=int, default=200, help="trace arrivals per rate")
    ap.add_argument(
        "--admission-share",
        type=admission_share,
        default=ADMISSION_SHARE,
        help="dp-tardy's door while its queue is overloaded: a share of the deadline in (0, 1], "
        f"or off (default {ADMISSION_SHARE:.3g}, the server's)",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "peers-sim.json"))
    a = ap.parse_args(argv)
    if not a.decode_ms >= 0:
        raise SystemExit(f"--decode-ms: expected a time of at least 0 ms, got {a.decode_ms:g}")
    if a.replicas < 1:
        raise SystemExit(f"--replicas: expected at least 1 device, got {a.replicas}")
    if not 0 < a.time_scale < float("inf"):
        raise SystemExit(f"--time-scale: expected a positive factor, got {a.time_scale:g}")
    if not 0 < a.overrun < float("inf"):
        raise SystemExit(f"--overrun: expected a positive factor, got {a.overrun:g}")
    arrivals = a.arrivals.split(",")
    for arrival in arrivals:
        if arrival not in START:
            raise SystemExit(f"--arrivals: expected poisson and/or azure, got {arrival!r}")
    models = a.models.split(",")
    for model in models:
        if not profile_path(a.profiles, model).exists():
            raise SystemExit(
                f"--models: expected models with a CPU profile in {a.profiles}, got {model!r} "
                f"({profile_path(a.profiles, model).name} is missing)"
            )
    trace = load_timestamps(AZURE_TRACE)
    rows: list[dict[str, Any]] = []
    table = []
    bounds = {}
    columns = "".join(f"{p:>10}" for p in POLICIES)
    print(f"{'model':<14}{'deadline':>9} {'arrivals':<9}{columns}{'dp-tardy / best':>17}")
    for model in models:
        d = deployment(model, a.max_batch, a.time_scale, a.profiles)
        bounds[model] = a.replicas * profile_bound_rps(d, a.decode_ms)
        for deadline in (float(x) for x in a.deadlines.split(",")):
            for arrival in arrivals:
                n = a.requests if arrival == "poisson" else a.trace_requests
                on_time = sweep(
                    d, model, arrival, deadline, n, a.seed, trace,
                    admission_share=a.admission_share, decode_ms=a.decode_ms,
                    replicas=a.replicas, overrun=a.overrun,
                )  # fmt: skip
                these = results(model, arrival, deadline, on_time)
                rows += these
                at = crossings(these)
                ratio = gain(these)
                row = {"model": model, "deadline_ms": deadline, "arrival": arrival}
                table.append({**row, "crossing_rps": at, "gain": ratio})
                print(
                    f"{model:<14}{deadline:>7g}ms {arrival:<9}"
                    + "".join(f"{at[p]:>10g}" for p in POLICIES)
                    + f"{ratio if ratio else '-':>16}x",
                    flush=True,
                )
    print(
        f"req/s where the on-time ratio crosses {THRESHOLD} (simulated, {a.decode_ms:g} ms "
        f"decode a request, batches of at most {a.max_batch}, {a.replicas} device(s) at "
        f"x{a.time_scale:g} the profiles in {a.profiles}, steps x{a.overrun:g} their plan; "
        f"dp-tardy's admission "
        f"{'off' if a.admission_share is None else f'share {a.admission_share:.3g}'})"
    )
    out = Path(a.out)
    doc = {
        "settings": {**vars(a), "profiles": str(a.profiles)},
        "compute_bound_rps": bounds,
        "table": table,
        "results": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    plot(rows, bounds, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()

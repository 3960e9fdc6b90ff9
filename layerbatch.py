"""layerbatch: the one command line (`layerbatch <verb>`, also `python -m layerbatch`).

Verbs: demo, schedule, sim, sim capacity, profiles. A mistake in a file or a flag ends the
command with one line naming it and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from scheduler.errors import InputError
from traces.arrivals import TraceError

BUNDLED_PROFILES = Path(__file__).resolve().parent / "traces" / "data" / "profiles"
BUNDLED_TRACE = (
    Path(__file__).resolve().parent
    / "traces"
    / "data"
    / "request_traces"
    / "AzureLLMInferenceTrace_code.csv"
)
DEMO_PROFILE = "googlenet-v3-pytorch-V100"
ONE_GROUP_PER_STAGE = 10**6  # G at least any model's stage count: the layer-unit form
POLICY_CHOICES = ("nobatch", "dynamic", "batch", "nexus", "edf", "dp-time", "dp-tardy")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:2] == ["sim", "capacity"]:
            return cmd_capacity(capacity_parser().parse_args(args[2:]))
        ns = parser().parse_args(args)
        if ns.verb is None:
            parser().print_help()
            return 2
        result: int = ns.func(ns)
        return result
    except (InputError, TraceError) as exc:
        print(f"layerbatch: {exc}", file=sys.stderr)
        return 2
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


# --- parsers --------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = Parser(prog="layerbatch", description="Layer-wise batching for DNN serving at the edge.")
    sub = p.add_subparsers(dest="verb", metavar="VERB")

    demo = sub.add_parser(
        "demo", help="simulated capacity of every policy on a shipped GPU profile"
    )
    demo.add_argument(
        "--requests",
        type=_positive_int,
        default=1500,
        help="requests per simulated rate (default 1500)",
    )
    demo.add_argument(
        "--plot", default="out/demo-capacity.png", help="where to draw the comparison"
    )
    demo.set_defaults(func=cmd_demo)

    sch = sub.add_parser("schedule", help="plan one snapshot of requests with one policy")
    _add_deployment_args(sch)
    sch.add_argument(
        "--state", required=True, help="state.json: now_ms, max_batch, groups, requests"
    )
    sch.add_argument("--policy", choices=POLICY_CHOICES, default="dp-time")
    sch.add_argument("--exact", action="store_true", help="dp-*: the per-request O(R^2) form")
    sch.add_argument(
        "--groups", type=_groups, default=None, help="layer groups G, or 'layer' for one per stage"
    )
    sch.add_argument("--json", action="store_true", help="print the plan as JSON")
    sch.set_defaults(func=cmd_schedule)

    sim = sub.add_parser("sim", help="simulate a workload (also: layerbatch sim capacity ...)")
    _add_deployment_args(sim)
    _add_workload_args(sim)
    sim.add_argument("--policy", choices=POLICY_CHOICES, default="dp-time")
    sim.add_argument(
        "--rate", type=_positive_float, default=100.0, help="mean request rate, req/s (default 100)"
    )
    sim.add_argument(
        "--requests", type=_positive_int, default=5000, help="number of requests (default 5000)"
    )
    sim.add_argument(
        "--time-plans",
        action="store_true",
        help="measure planning time (wall clock; output no longer byte-identical)",
    )
    sim.add_argument("--json", action="store_true")
    sim.set_defaults(func=cmd_sim)

    prof = sub.add_parser("profiles", help="list the profiles shipped with layerbatch")
    prof.set_defaults(func=cmd_profiles)
    return p


def capacity_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="layerbatch sim capacity",
        description="Capacity (highest rate with on-time ratio >= 0.9) of each policy.",
    )
    _add_deployment_args(p)
    _add_workload_args(p)
    p.add_argument(
        "--policies", default="nobatch,dynamic,batch,edf,dp-time,dp-tardy", help="comma list"
    )
    p.add_argument(
        "--rates", default="10:400:10", help="START:STOP:STEP (inclusive) or a comma list, req/s"
    )
    p.add_argument(
        "--requests", type=_positive_int, default=2000, help="requests per run (default 2000)"
    )
    p.add_argument(
        "--jobs",
        type=_positive_int,
        default=os.cpu_count() or 1,
        help="worker processes (default: all cores)",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--plot", default=None, help="PNG: on-time ratio and mean completion against rate"
    )
    return p


def _add_deployment_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile",
        action="append",
        required=True,
        help="layerbatch.profile/1 file or shipped name; repeat for several models",
    )
    p.add_argument(
        "--apps", default=None, help='apps.json: {"apps": {"pose": ["detector", "head"]}}'
    )
    p.add_argument(
        "--max-batch", type=_positive_int, default=None, help="cap on every model's batch bound B"
    )


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--arrival", choices=("poisson", "pareto", "constant", "recorded"), default="poisson"
    )
    p.add_argument(
        "--trace",
        default=None,
        help="timestamps for --arrival recorded (default: the bundled Azure trace)",
    )
    p.add_argument("--mix", default=None, help="app=share,... (default: equal shares)")
    p.add_argument(
        "--deadline-ms",
        type=_positive_float,
        default=150.0,
        help="deadline after arrival (default 150)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--groups", type=_groups, default=None, help="layer groups G (default 5), or 'layer'"
    )
    p.add_argument("--exact", action="store_true", help="dp-*: the per-request O(R^2) form")


class UsageError(Exception):
    """A flag argparse refused; printed as one line."""


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line naming the flag (no usage dump), exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"layerbatch: {message} (see {self.prog} --help)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def _groups(text: str) -> int:
    if text == "layer":
        return ONE_GROUP_PER_STAGE
    try:
        g = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer or 'layer', got {text!r}"
        ) from None
    if g < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'layer', got {text!r}")
    return g


# --- shared pieces --------------------------------------------------------------------------
def _profile_path(name: str) -> Path:
    p = Path(name)
    if p.exists() or p.suffix == ".json":
        return p
    shipped = BUNDLED_PROFILES / f"{name}.json"
    if shipped.exists():
        return shipped
    names = ", ".join(sorted(x.stem for x in BUNDLED_PROFILES.glob("*.json")))
    raise InputError("--profile", "", f"a profile file or a shipped profile name ({names})", name)


def _deployment_inputs(ns: argparse.Namespace) -> tuple[list[Any], list[Any], list[Any]]:
    """(profiles, all apps, apps named in --apps)."""
    from scheduler.deployment import Deployment
    from scheduler.profile import load_profile
    from scheduler.snapshot import load_apps, with_model_apps

    profiles = [load_profile(_profile_path(p)) for p in ns.profile]
    named = load_apps(ns.apps) if ns.apps else []
    apps = with_model_apps(profiles, named)
    Deployment(profiles, apps, source=ns.apps or "--profile")  # apps name known models
    return profiles, apps, named


def _build(ns: argparse.Namespace) -> tuple[Any, list[Any]]:
    from scheduler.deployment import DEFAULT_GROUPS, Deployment

    profiles, apps, named = _deployment_inputs(ns)
    source = ns.apps or "--profile"
    d = Deployment(profiles, apps, ns.max_batch, ns.groups or DEFAULT_GROUPS, source)
    return d, named


def _trace(ns: argparse.Namespace) -> Any:
    from traces.arrivals import load_timestamps

    if ns.arrival != "recorded":
        return None
    return load_timestamps(ns.trace or BUNDLED_TRACE)


def _mix(ns: argparse.Namespace, d: Any, named: list[Any]) -> dict[str, float]:
    from sim.workload import parse_mix

    if ns.mix is None and named:
        return {a.name: 1.0 / len(named) for a in named}
    return parse_mix(ns.mix, d)


# --- verbs ----------------------------------------------------------------------------------
def cmd_schedule(ns: argparse.Namespace) -> int:
    from scheduler.policies import make_policy
    from scheduler.snapshot import load_state, plan_to_json

    profiles, apps, _ = _deployment_inputs(ns)
    snap = load_state(ns.state, profiles, apps, ns.groups, ns.max_batch)
    policy = make_policy(ns.policy, exact=ns.exact)
    t0 = time.perf_counter()
    plan = policy.plan(snap.state, snap.now_ms)
    plan_us = (time.perf_counter() - t0) * 1e6
    doc = plan_to_json(plan, plan_us)
    if ns.json:
        print(json.dumps(doc))
        return 0
    print(
        f"policy {plan.policy}: {len(plan.actions)} actions, objective {doc['objective']}, planned in {doc['plan_us']} us"
    )
    for a in doc["actions"]:
        wait = f" (not before {a['not_before_ms']} ms)" if "not_before_ms" in a else ""
        print(
            f"  {a['model']}[{a['stages'][0]}:{a['stages'][1]}] x{len(a['requests'])}: {' '.join(a['requests'])}{wait}"
        )
    for rid, t in doc["completion_ms"].items():
        print(f"  {rid} completes at {t} ms")
    for rid, why in doc["drop_reasons"].items():
        print(f"  {rid} dropped: {why}")
    return 0


def cmd_sim(ns: argparse.Namespace) -> int:
    import numpy as np

    from scheduler.policies import make_policy
    from sim.metrics import summarise
    from sim.simulator import simulate
    from sim.workload import make_workload

    d, named = _build(ns)
    w = make_workload(
        d,
        ns.rate,
        ns.requests,
        ns.arrival,
        _mix(ns, d, named),
        ns.deadline_ms,
        np.random.default_rng(ns.seed),
        _trace(ns),
    )
    out = simulate(
        d,
        make_policy(ns.policy, exact=ns.exact),
        w,
        timer=time.perf_counter if ns.time_plans else None,
    )
    s = summarise(out)
    if ns.json:
        print(json.dumps(s))
    else:
        print(
            f"{s['policy']} at {s['rate_rps']:g} req/s: on-time {s['on_time_ratio']:.3f}, "
            f"completed {s['completed']}/{s['requests']}, dropped {s['dropped']}, "
            f"mean {s['mean_ms']} ms, p99 {s['p99_ms']} ms, mean batch {s['mean_batch']}"
        )
    return 0


def cmd_capacity(ns: argparse.Namespace) -> int:
    doc = run_capacity(ns, progress=not ns.json or sys.stderr.isatty())
    if ns.json:
        print(json.dumps(doc))
    else:
        print_capacity(doc)
    return 0


def run_capacity(ns: argparse.Namespace, progress: bool) -> dict[str, Any]:
    from tqdm import tqdm

    from sim.capacity import Setup, capacities, parse_rates, ratios, sweep

    d, named = _build(ns)
    policies = [p.strip() for p in ns.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICY_CHOICES]
    if bad or not policies:
        raise InputError(
            "--policies", "", f"a comma list of {', '.join(POLICY_CHOICES)}", ns.policies
        )
    if ns.requests < 1:
        raise InputError("--requests", "", "a positive number of requests", ns.requests)
    rates = parse_rates(ns.rates)
    trace = _trace(ns)
    setup = Setup(
        tuple(d.profiles.values()),
        tuple(d.apps.values()),
        ns.max_batch,
        d.groups,
        tuple(sorted(_mix(ns, d, named).items())),
        ns.arrival,
        ns.requests,
        ns.deadline_ms,
        ns.seed,
        ns.exact,
        None if trace is None else tuple(float(x) for x in trace),
    )
    with tqdm(
        total=len(policies) * len(rates),
        desc="simulating",
        unit="run",
        disable=not progress,
        file=sys.stderr,
    ) as bar:
        runs = sweep(setup, policies, rates, max(1, ns.jobs), bar.update)
    caps = capacities(runs)
    baseline = "dynamic" if "dynamic" in caps else policies[0]
    doc = {
        "profiles": [f"{p.model}@{p.device}" for p in d.profiles.values()],
        "deadline_ms": ns.deadline_ms,
        "arrival": ns.arrival,
        "requests_per_run": ns.requests,
        "capacity_rps": caps,
        "baseline": baseline,
        "ratio_to_baseline": ratios(caps, baseline),
        "runs": runs,
    }
    if ns.plot:
        from sim.plot import plot_capacity

        title = (
            f"{', '.join(doc['profiles'])}: {ns.arrival} arrivals, deadline {ns.deadline_ms:g} ms"
        )
        plot_capacity(runs, caps, title, ns.plot)
        doc["plot"] = str(ns.plot)
    return doc


def print_capacity(doc: dict[str, Any]) -> None:
    base = doc["baseline"]
    print(
        f"capacity (highest rate with on-time ratio >= 0.9), {', '.join(doc['profiles'])}, deadline {doc['deadline_ms']:g} ms"
    )
    print(f"{'policy':<10} {'capacity req/s':>15} {'x ' + base:>12}")
    for p, c in doc["capacity_rps"].items():
        r = doc["ratio_to_baseline"][p]
        print(
            f"{p:<10} {('-' if c is None else f'{c:g}'):>15} {('-' if r is None else f'{r:.2f}'):>12}"
        )
    if "plot" in doc:
        print(f"plot: {doc['plot']}")


def cmd_demo(ns: argparse.Namespace) -> int:
    args = capacity_parser().parse_args(
        [
            "--profile",
            DEMO_PROFILE,
            "--policies",
            ",".join(POLICY_CHOICES),
            "--rates",
            "25:500:25",
            "--requests",
            str(ns.requests),
            "--deadline-ms",
            "150",
            "--plot",
            ns.plot,
        ]
    )
    print(
        "layerbatch demo: the simulator runs every policy against the measured V100 block timings"
    )
    print(f"of {DEMO_PROFILE} (PPipe, TensorRT), Poisson arrivals, deadline 150 ms.\n")
    print_capacity(run_capacity(args, progress=True))
    return 0


def cmd_profiles(ns: argparse.Namespace) -> int:
    from scheduler.profile import load_profile

    for path in sorted(BUNDLED_PROFILES.glob("*.json")):
        p = load_profile(path)
        solo = sum(p.latency_ms(k, 1) for k in range(p.num_stages))
        print(
            f"{path.stem:<32} {p.device:<22} {p.num_stages:>3} stages  batch-1 {solo:7.2f} ms  max_batch {p.max_batch}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

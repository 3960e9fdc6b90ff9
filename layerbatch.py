"""layerbatch: the one command line (`layerbatch <verb>`, also `python -m layerbatch`).

Verbs: demo, schedule, sim, sim capacity, profiles, profile, models, serve, client, loadgen,
linkshell, traces, plan, pipeline plan, pipeline sim. A mistake in a file or a flag ends the
command with one line naming it and exit status 2.
"""

from __future__ import annotations

import argparse
import errno
import functools
import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from scheduler.admission import ADMISSION_SHARE
from scheduler.deployment import DEFAULT_MIN_GROUP_MS
from scheduler.errors import InputError
from scheduler.policies import POLICIES as POLICY_CHOICES
from scheduler.profile import MAX_BATCH as MAX_PROFILE_BATCH
from scheduler.validate import MAX_LATENCY_MS, did_you_mean
from traces.arrivals import MAX_RATE_RPS as MAX_SIM_RATE_RPS
from traces.arrivals import MIN_RATE_RPS as MIN_SIM_RATE_RPS
from traces.arrivals import TraceError

if TYPE_CHECKING:
    from scheduler.pipeline.milp import Cluster
    from scheduler.pipeline.profiles import ModelProfiles

BUNDLED_PROFILES = Path(__file__).resolve().parent / "traces" / "data" / "profiles"
BUNDLED_TRACE = (
    Path(__file__).resolve().parent
    / "traces"
    / "data"
    / "request_traces"
    / "AzureLLMInferenceTrace_code.csv"
)
DEMO_PROFILE = "googlenet-v3-pytorch-V100"
DEMO_SIM_RATES = "25:500:25"  # req/s, `layerbatch demo --sim`
ONE_GROUP_PER_STAGE = 10**6  # G at least any model's stage count: the layer-unit form


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:2] == ["sim", "capacity"]:
            return cmd_capacity(capacity_parser().parse_args(args[2:]))
        if args[:2] == ["pipeline", "plan"]:
            return cmd_pipeline_plan(pipeline_plan_parser().parse_args(args[2:]))
        if args[:2] == ["pipeline", "sim"]:
            return cmd_pipeline_sim(pipeline_sim_parser().parse_args(args[2:]))
        ns, unknown = parser().parse_known_args(args)
        if unknown:  # argparse would point at the top-level help; the verb's says more
            where = f"layerbatch {ns.verb}" if ns.verb else "layerbatch"
            raise UsageError(
                f"layerbatch: unrecognized arguments: {' '.join(unknown)} (see {where} --help)"
            )
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
    except BrokenPipeError:  # the reader went away (`layerbatch ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


# --- parsers --------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = Parser(prog="layerbatch", description="Layer-wise batching for DNN serving at the edge.")
    sub = p.add_subparsers(dest="verb", metavar="VERB")

    demo = sub.add_parser(
        "demo",
        help="the server on this machine under a built-in load, per policy (--sim: simulated)",
    )
    demo.add_argument(
        "--sim", action="store_true", help="instead: simulated capacity on a shipped GPU profile"
    )
    demo.add_argument(
        "--rate",
        type=_sim_rates,
        default=None,
        help="offered load, req/s: one or a comma list (default 30,60,90,120,150; "
        f"--sim: {DEMO_SIM_RATES})",
    )
    demo.add_argument(
        "--duration",
        type=_float_up_to(MAX_DURATION_S),
        default=None,
        help="seconds per policy at each rate (default 6; not with --sim)",
    )
    demo.add_argument(
        "--deadline-ms",
        type=_positive_float,
        default=None,
        help="deadline (default 300; --sim: 150)",
    )
    demo.add_argument(
        "--requests",
        type=_count_up_to(MAX_REQUESTS),
        default=None,
        help="--sim: requests per simulated rate (default 1500)",
    )
    demo.add_argument(
        "--plot", type=_plot_file, default=None, help="where to draw the comparison (.png, .svg)"
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
    _add_simulated_device_args(sim)
    sim.add_argument("--policy", choices=POLICY_CHOICES, default="dp-time")
    sim.add_argument(
        "--rate", type=_sim_rate, default=100.0, help="mean request rate, req/s (default 100)"
    )
    sim.add_argument(
        "--requests",
        type=_count_up_to(MAX_REQUESTS),
        default=5000,
        help="number of requests (default 5000)",
    )
    sim.add_argument(
        "--time-plans",
        action="store_true",
        help="measure planning time (wall clock; output no longer byte-identical)",
    )
    sim.add_argument("--json", action="store_true")
    sim.set_defaults(func=cmd_sim)

    srv = sub.add_parser("serve", help="run the edge server")
    srv.add_argument(
        "--apps",
        default=None,
        help="comma list of models to serve, each an app (default: a small set)",
    )
    srv.add_argument("--policy", choices=POLICY_CHOICES, default="dp-tardy")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=_port, default=8080)
    srv.add_argument(
        "--profiles",
        type=_folder,
        default=None,
        help="folder of {model}-cpu.json profiles; missing ones are measured there",
    )
    srv.add_argument(
        "--memory-mb",
        type=_positive_float,
        default=None,
        help="activation memory budget: sets B per model",
    )
    srv.add_argument(
        "--threads",
        type=_count_up_to(MAX_THREADS),
        default=None,
        help="torch intra-op threads of each replica (default: all cores but one, left to "
        "decode, parse and plan, shared among the replicas; at least 1 each)",
    )
    srv.add_argument(
        "--replicas",
        type=_count_up_to(MAX_THREADS),
        default=1,
        help="runtimes on this machine, each its own executor thread, queue and plans, on the "
        "same weights; a request joins the one with the least work left (default 1; on a "
        "2-core CPU, --replicas 2 --threads 1 served more on time than one runtime on 2 threads)",
    )
    srv.add_argument(
        "--admin-token",
        default=None,
        help="required as 'Authorization: Bearer T' by PUT /v1/policy",
    )
    srv.add_argument(
        "--max-queued",
        type=_positive_int,
        default=1000,
        help="requests queued before answering 503",
    )
    srv.add_argument(
        "--deadline-ms",
        type=_deadline_ms,
        default=1000.0,
        help="deadline of requests that give none",
    )
    srv.add_argument(
        "--no-fold-bn",
        dest="fold_bn",
        action="store_false",
        help="serve the models as defined (default: batch norms folded into the convolutions "
        "before them at load: the same function up to float rounding, 4-29%% faster on a CPU)",
    )
    srv.add_argument(
        "--no-script",
        dest="script",
        action="store_false",
        help="run the stages as eager torch (default: each stage as TorchScript, traced and "
        "frozen at load, which takes the GIL back once a stage instead of after every op)",
    )
    srv.add_argument(
        "--min-group-ms",
        type=_ms_up_to_an_hour,
        default=DEFAULT_MIN_GROUP_MS,
        help="cut a model into fewer than 5 layer groups where its groups would take less than "
        "this at batch 1 (each group ends a step, and a step's hand-off costs about 1 ms on a "
        "2-core CPU; default %(default)g, 0: 5 groups for every model)",
    )
    srv.add_argument(
        "--step-log",
        type=_output_file,
        metavar="FILE",
        help="write every step it runs to FILE, one JSON line each (model, stages, batch, ms, "
        "planned ms), and every request its plans drop (how late it was predicted); "
        "bench/step_replay.py replays the steps alone",
    )
    srv.set_defaults(func=cmd_serve)

    cli = sub.add_parser("client", help="a mobile client: frames run locally, sent, or split")
    _add_client_args(cli)
    cli.add_argument(
        "--fps", type=_float_up_to(MAX_RATE_RPS), default=None, help="frames/s (default 10)"
    )
    cli.add_argument("--arrival", choices=("constant", "poisson"), default="constant")
    cli.add_argument(
        "--rate", type=_float_up_to(MAX_RATE_RPS), default=None, help="--arrival poisson: req/s"
    )
    cli.add_argument("--offload", choices=("none", "local", "binary", "partial"), default="binary")
    cli.add_argument(
        "--uplink-offset-s",
        type=_non_negative_float,
        default=0.0,
        help="start the traces here (default 0)",
    )
    cli.add_argument(
        "--plot", type=_plot_file, default=None, help="PNG: latency CDF and decisions over time"
    )
    cli.set_defaults(func=cmd_client)

    gen = sub.add_parser("loadgen", help="many simulated clients against a server (--sweep: N)")
    _add_client_args(gen)
    gen.add_argument("--clients", type=_clients, default=[4], help="N (with --sweep: a comma list)")
    gen.add_argument(
        "--rate-per-client", type=_float_up_to(MAX_RATE_RPS), default=10.0, help="req/s"
    )
    gen.add_argument("--offload", choices=("none", "binary", "partial"), default="binary")
    gen.add_argument(
        "--sweep", action="store_true", help="each N of --clients, for none, binary and partial"
    )
    gen.add_argument(
        "--plot", type=_plot_file, default=None, help="--sweep: PNG of on-time ratio against N"
    )
    gen.set_defaults(func=cmd_loadgen)

    shell = sub.add_parser("linkshell", help="a TCP proxy pacing bytes by LTE/WiFi traces")
    shell.add_argument(
        "--uplink", required=True, help="trace file or bundled name (client->server)"
    )
    shell.add_argument("--downlink", required=True, help="trace file or bundled name")
    shell.add_argument(
        "--listen", default="127.0.0.1:9000", help="HOST:PORT (default 127.0.0.1:9000)"
    )
    shell.add_argument("--upstream", default="127.0.0.1:8080", help="HOST:PORT of the server")
    shell.set_defaults(func=cmd_linkshell)

    cost = sub.add_parser(
        "plan", help="what to rent in the cloud at minimum cost (Harpagon/Piccolo)"
    )
    cost.add_argument("--workload", required=True, help="workload JSON (hardware, modules, apps)")
    cost.add_argument(
        "--system",
        choices=("harpagon", "piccolo", "nexus", "scrooge", "inferline", "clipper", "optimal"),
        default="harpagon",
    )
    cost.add_argument("--dispatch", choices=("tc", "rr", "machine", "2d"), default=None)
    cost.add_argument("--configs", choices=("1", "2", "any"), default="any")
    cost.add_argument("--no-dummy", action="store_true", help="no dummy requests (Theorem 2)")
    cost.add_argument("--no-reassign", action="store_true", help="no latency reassigner")
    cost.add_argument(
        "--split",
        default=None,
        help="lc|throughput|greedy|even|quantized:STEP (default: the system's)",
    )
    cost.add_argument("--no-merge", action="store_true", help="no node merger (Algorithm 2)")
    cost.add_argument("--no-cost-direct", action="store_true", help="no cost-direct iterations")
    cost.add_argument(
        "--no-exchange",
        action="store_true",
        help="no budget exchange between modules (harpagon as the paper has it)",
    )
    cost.add_argument("--json", action="store_true", help="the plan document as JSON")
    cost.set_defaults(func=cmd_plan)

    sub.add_parser(
        "pipeline",
        help="split models across pools of mixed GPUs (PPipe): `pipeline plan|sim ...`",
        description="Split models across pools of mixed GPUs (PPipe). Two verbs: "
        "`layerbatch pipeline plan` (the MILP: which blocks on which GPUs) and "
        "`layerbatch pipeline sim` (a plan's data plane, simulated); each has --help.",
    ).set_defaults(
        func=lambda ns: _usage("layerbatch pipeline plan --help, or layerbatch pipeline sim --help")
    )

    traces = sub.add_parser("traces", help="list the network traces shipped with layerbatch")
    traces.set_defaults(func=cmd_traces)

    meas = sub.add_parser("profile", help="measure a model's per-stage latency profile")
    meas.add_argument(
        "--model", required=True, help="a model layerexec knows (see layerbatch models)"
    )
    meas.add_argument(
        "--batch-sizes",
        type=_batch_sizes,
        default=[1, 2, 4, 8],
        help="comma list (default 1,2,4,8)",
    )
    meas.add_argument(
        "--threads",
        type=_count_up_to(MAX_THREADS),
        default=os.cpu_count() or 1,
        help="torch intra-op threads",
    )
    meas.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    meas.add_argument(
        "--runs",
        type=_positive_int,
        default=5,
        help="timed runs per stage and batch size (median kept)",
    )
    meas.add_argument("--warmup", type=_count_up_to_from_zero(MAX_COUNT), default=2)
    meas.add_argument(
        "--max-batch",
        type=_count_up_to(MAX_PROFILE_BATCH),
        default=None,
        help="B to record (default: the largest batch size)",
    )
    meas.add_argument(
        "--memory-mb",
        type=_positive_float,
        default=None,
        help="derive max_batch from this activation memory budget",
    )
    meas.add_argument(
        "--stack-with",
        default="",
        help="comma list of models: measure the slowdown when run beside each",
    )
    meas.add_argument(
        "--no-channels-last", action="store_true", help="keep the default memory layout"
    )
    meas.add_argument(
        "--verify",
        action="store_true",
        help="check that the stages compute what the whole model does",
    )
    meas.add_argument(
        "--out",
        type=_json_file,
        default=None,
        help="where to write the layerbatch.profile/1 JSON (required unless --verify alone)",
    )
    meas.set_defaults(func=cmd_profile)

    models = sub.add_parser("models", help="list the models layerexec can load")
    models.set_defaults(func=cmd_models)

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
    _add_simulated_device_args(p)
    p.add_argument(
        "--policies", default="nobatch,dynamic,batch,edf,dp-time,dp-tardy", help="comma list"
    )
    p.add_argument(
        "--rates", default="10:400:10", help="START:STOP:STEP (inclusive) or a comma list, req/s"
    )
    p.add_argument(
        "--requests",
        type=_count_up_to(MAX_REQUESTS),
        default=2000,
        help="requests per run (default 2000)",
    )
    p.add_argument(
        "--jobs",
        type=_count_up_to(MAX_THREADS),
        default=os.cpu_count() or 1,
        help="worker processes (default: all cores)",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--plot",
        type=_plot_file,
        default=None,
        help="PNG: on-time ratio and mean completion against rate",
    )
    return p


def _add_client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--server", type=_server_url, default="http://127.0.0.1:8080", help="the edge server's URL"
    )
    p.add_argument("--app", default="resnet18", help="the app (a model name) to run")
    p.add_argument(
        "--source", default=None, help="video file, or 'synthetic' (default: the bundled clip)"
    )
    p.add_argument(
        "--frames", type=_count_up_to(1000), default=120, help="distinct frames to use (<= 1000)"
    )
    p.add_argument("--deadline-ms", type=_deadline_ms, default=300.0)
    p.add_argument("--uplink", default=None, help="trace file or bundled name (see traces)")
    p.add_argument("--downlink", default=None, help="trace file or bundled name")
    p.add_argument(
        "--link-scale",
        type=_positive_float,
        default=1.0,
        help="multiply the traces' capacity (the paper's x10 LTE stands for 5G)",
    )
    p.add_argument(
        "--client-slowdown",
        type=_at_least_one,
        default=1.0,
        help="the device is F times slower than this machine (local stage time x F)",
    )
    p.add_argument(
        "--client-threads", type=_count_up_to(MAX_THREADS), default=1, help="torch threads"
    )
    p.add_argument(
        "--duration", type=_float_up_to(MAX_DURATION_S), default=20.0, help="seconds (default 20)"
    )
    p.add_argument("--seed", type=_non_negative_int, default=0)
    p.add_argument(
        "--json-out",
        type=_json_file,
        default=None,
        help="write summary and per-frame records here",
    )


def pipeline_plan_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="layerbatch pipeline plan",
        description="Pooled pipelines for one or several models on a mixed GPU cluster (PPipe "
        "MILP, HiGHS). Models come from PPipe block timings (--profiles, --model) or from "
        "layerbatch.profile/1 files grouped into N equal-time blocks (--profile, --blocks).",
    )
    p.add_argument("--profiles", default=None, help="PPipe block timings (default: bundled)")
    p.add_argument(
        "--model",
        action="append",
        default=None,
        help="model in --profiles (default repvgg-b3); repeat for several models",
    )
    p.add_argument(
        "--profile",
        action="append",
        default=None,
        metavar="[GPU=]FILE",
        help="layerbatch.profile/1 file, one per GPU type (GPU: its device up to the first "
        "'-' unless given); files of several models plan them together",
    )
    p.add_argument(
        "--blocks", type=_positive_int, default=None, help="--profile: N blocks (default 10)"
    )
    p.add_argument(
        "--cluster",
        required=True,
        help='JSON: {"gpus": {"L4": {"count", "per_server"}}, "nic_gbps"}',
    )
    p.add_argument(
        "--slo-ms", required=True, help="SLO in ms, or per model: NAME=MS,... (several models)"
    )
    p.add_argument(
        "--share",
        default=None,
        help="several models: workload shares NAME=SHARE,... (default equal); maximises the "
        "smallest throughput / share",
    )
    p.add_argument("--margin", type=float, default=0.1, help="share of the SLO kept back")
    p.add_argument("--max-parts", type=_positive_int, default=3)
    p.add_argument("--mps", type=_positive_int, default=4, help="highest MPS level")
    p.add_argument("--system", choices=("ppipe", "np", "dart-r"), default="ppipe")
    p.add_argument("--time-limit-s", type=_positive_float, default=None)
    p.add_argument("--json", action="store_true")
    return p


def pipeline_sim_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="layerbatch pipeline sim",
        description="Simulate a pipeline plan's data plane (PPipe reservation-based batching or "
        "the reactive baseline): SLO attainment at a load factor, or against load factor.",
    )
    p.add_argument("--plan", required=True, help="plan JSON from `layerbatch pipeline plan --json`")
    p.add_argument("--profiles", default=None, help="PPipe block timings (default: bundled)")
    p.add_argument("--model", default="repvgg-b3", help="the model the plan was made for")
    p.add_argument("--cluster", required=True, help="the cluster JSON the plan was made for")
    p.add_argument("--slo-ms", type=_positive_float, required=True, help="the plan's SLO")
    p.add_argument(
        "--load-factor",
        type=_float_up_to(MAX_LOAD_FACTOR),
        default=None,
        help="rate / plan throughput (0.9; not with --sweep)",
    )
    p.add_argument("--sweep", action="store_true", help="load factors 0.05..1.0 step 0.05")
    p.add_argument("--arrival", choices=("poisson", "trace"), default="poisson")
    p.add_argument(
        "--trace", default=None, help="request trace for --arrival trace (bundled Azure)"
    )
    p.add_argument("--policy", choices=("ppipe", "reactive"), default="ppipe")
    p.add_argument("--duration-s", type=_positive_float, default=30.0)
    p.add_argument("--seed", type=_non_negative_int, default=0)
    p.add_argument(
        "--noise-sigma",
        type=_noise_sigma,
        default=0.02,
        help="GPU time log-normal sigma (0.02)",
    )
    p.add_argument("--json", action="store_true")
    return p


def _usage(hint: str) -> int:
    raise UsageError(f"layerbatch: say what to do: {hint}")


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


def _add_simulated_device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--step-gap-ms",
        type=_ms_up_to_an_hour,
        default=0.0,
        help="device idle time between two steps (a server's /v1/status step_gap_ms; default 0)",
    )
    p.add_argument(
        "--decode-ms",
        type=_ms_up_to_an_hour,
        default=0.0,
        help="device time each admitted request's decode costs before the device's next step, as "
        "on a server whose torch threads take every core (its /v1/status decode_ms; the plans "
        "count it in each model's first stage; default 0)",
    )
    p.add_argument(
        "--replicas",
        type=_count_up_to(MAX_THREADS),
        default=1,
        help="devices, each with its own queue and plans, a request joining the one with the "
        "least work left, as `layerbatch serve --replicas` (each runs at the profile's speed: "
        "give one measured with a replica's threads; default 1)",
    )
    p.add_argument(
        "--admission-share",
        type=_share,
        default=None,
        help="under dp-tardy, turn a request away on arrival when the work queued ahead leaves it "
        "no room within its deadline, or within this share of it while the queue is overloaded "
        "(since a drop, until an arrival finds it empty), as `layerbatch serve` does with "
        f"{ADMISSION_SHARE:.3g} (scheduler/admission.py; default: off, every request joins)",
    )
    p.add_argument(
        "--min-group-ms",
        type=_ms_up_to_an_hour,
        default=0.0,
        help="fewer layer groups for models whose groups would take less than this at batch 1, "
        "as `layerbatch serve --min-group-ms` (the server's default is "
        f"{DEFAULT_MIN_GROUP_MS:g}; default 0: G groups for every model)",
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
    p.add_argument("--seed", type=_non_negative_int, default=1)
    p.add_argument(
        "--groups", type=_groups, default=None, help="layer groups G (default 5), or 'layer'"
    )
    p.add_argument("--exact", action="store_true", help="dp-*: the per-request O(R^2) form")


class UsageError(Exception):
    """A flag argparse refused; printed as one line."""


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line naming the flag (no usage dump), exit status 2, and
    a flag is only ever its whole name (argparse would read `--profile` as `--profiles`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"layerbatch: {message} (see {self.prog} --help)")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """argparse's refusal of a value outside `choices=` (a verb, --policy, --system, ...),
        with the choice nearest a misspelt one: "...; did you mean dp-tardy?"."""
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            hint = did_you_mean(str(value), [str(c) for c in action.choices or ()])
            raise argparse.ArgumentError(action, f"{exc.message}{hint}") from None


MAX_COUNT = 10**6  # the largest any integer flag takes unless it says less
MAX_REQUESTS = 10**7  # simulated requests in one run: about a GB of arrays
MAX_THREADS = 1024
MAX_RATE_RPS = 1000.0  # a client's frames or requests per second
MAX_DURATION_S = 86_400.0  # a run of a client or load generator: a day
MAX_CLIENTS = 1000  # simulated clients of one load generator
MAX_LOAD_FACTOR = 100.0  # `pipeline sim`: offered load over the plan's throughput


def _ascii_number(text: str) -> bool:
    """Written in ASCII digits without '_' (Python's int() and float() also take '1_000' and
    other scripts' digits, which no one means on a command line)."""
    return text.isascii() and "_" not in text


def _positive_int(text: str, most: int = MAX_COUNT) -> int:
    value = int(text) if _ascii_number(text) and text.strip().isdigit() else 0
    if not 1 <= value <= most:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer up to {most}, got {text!r}"
            if value > most
            else f"expected a positive integer, got {text!r}"
        )
    return value


def _count_up_to(most: int) -> Callable[[str], int]:
    """A positive integer flag of at most `most`."""
    return functools.partial(_positive_int, most=most)


def _float_up_to(most: float) -> Callable[[str], float]:
    """A positive finite number flag of at most `most`."""
    return functools.partial(
        _finite_float, ok=lambda v: 0 < v <= most, expected=f"a positive number up to {most:g}"
    )


def _non_negative_int(text: str) -> int:
    value = int(text) if _ascii_number(text) and text.strip().isdigit() else -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def _count_up_to_from_zero(most: int) -> Callable[[str], int]:
    """A non-negative integer flag of at most `most`."""

    def parse(text: str) -> int:
        value = _non_negative_int(text)
        if value > most:
            raise argparse.ArgumentTypeError(
                f"expected a non-negative integer up to {most}, got {text!r}"
            )
        return value

    return parse


PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def _output_file(text: str) -> Path:
    """A file to write when the work is done, checked before it starts: not a folder, and under
    a folder that exists or can be made, where this user may write."""
    path = Path(text)
    if not text or path.is_dir():
        raise argparse.ArgumentTypeError(f"expected a file to write, got the folder {text!r}")
    if path.is_symlink() and not path.resolve().parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"expected a file to write, got a link into a folder that does not exist: {text!r}"
        )
    ancestor = next(a for a in path.absolute().parents if a.exists())
    if not (ancestor.is_dir() and os.access(ancestor, os.W_OK | os.X_OK)):
        raise argparse.ArgumentTypeError(
            f"expected a file in a folder this user can write, got {text!r}"
        )
    return path


def _json_file(text: str) -> Path:
    """A file `_output_file` takes, named for the JSON written there (profile --out x.png
    wrote JSON into a file named x.png)."""
    path = _output_file(text)
    if path.suffix.lower() != ".json":
        raise argparse.ArgumentTypeError(
            f"expected a file ending .json, as what is written there is JSON, got {text!r}"
        )
    return path


def _plot_file(text: str) -> Path:
    if Path(text).suffix.lower() not in PLOT_SUFFIXES:
        raise argparse.ArgumentTypeError(
            f"expected a picture file ending {', '.join(PLOT_SUFFIXES)}, got {text!r}"
        )
    return _output_file(text)


def _folder(text: str) -> Path:
    """A folder, or where one is to be made: not a file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"expected a folder, got the file {text!r}")
    return path


def _server_url(text: str) -> str:
    from urllib.parse import urlsplit

    try:
        url = urlsplit(text)
        port = url.port
    except ValueError:
        url, port = None, None
    if url is None or url.scheme not in ("http", "https") or not url.hostname or port == 0:
        raise argparse.ArgumentTypeError(
            f"expected an http:// or https:// URL with a host (and port 1-65535), got {text!r}"
        )
    return text


def _port(text: str) -> int:
    value = int(text) if text.isascii() and text.isdigit() else 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text!r}")
    return value


def _finite_float(text: str, ok: Callable[[float], bool], expected: str) -> float:
    try:
        value = float(text) if _ascii_number(text) else math.nan
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and ok(value)):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    return _finite_float(text, lambda v: v > 0, "a positive finite number")


def _sim_rate(text: str) -> float:
    return _finite_float(
        text,
        lambda v: MIN_SIM_RATE_RPS <= v <= MAX_SIM_RATE_RPS,
        f"a request rate from {MIN_SIM_RATE_RPS:g} to {MAX_SIM_RATE_RPS:g} req/s",
    )


def _ms_up_to_an_hour(text: str) -> float:
    """A time in ms from 0 to an hour (scheduler.validate's bound on latencies)."""
    return _finite_float(
        text,
        lambda v: 0 <= v <= MAX_LATENCY_MS,
        f"a finite number >= 0, up to {MAX_LATENCY_MS:.0f} ms (an hour)",
    )


def _deadline_ms(text: str) -> float:
    """A request deadline in ms, at most what the server takes (server.wire.MAX_DEADLINE_MS)."""
    from server.wire import MAX_DEADLINE_MS

    return _finite_float(
        text,
        lambda v: 0 < v <= MAX_DEADLINE_MS,
        f"a deadline in ms above 0 and up to {MAX_DEADLINE_MS:.0f}, as the server takes",
    )


def _noise_sigma(text: str) -> float:
    from sim.pipeline_plane import MAX_NOISE_SIGMA

    return _finite_float(
        text,
        lambda v: 0 <= v <= MAX_NOISE_SIGMA,
        f"a finite number >= 0, up to {MAX_NOISE_SIGMA:g}",
    )


def _share(text: str) -> float:
    return _finite_float(text, lambda v: 0 < v <= 1, "a share of the deadline in (0, 1]")


def _non_negative_float(text: str) -> float:
    return _finite_float(text, lambda v: v >= 0, "a finite number >= 0")


def _at_least_one(text: str) -> float:
    value = _positive_float(text)
    if value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a factor >= 1, got {text!r}")
    return value


def _sim_rates(text: str) -> list[float]:
    try:
        return [_sim_rate(x) for x in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a request rate from {MIN_SIM_RATE_RPS:g} to {MAX_SIM_RATE_RPS:g} req/s or "
            f"a comma list of them, got {text!r}"
        ) from None


def _clients(text: str) -> list[int]:
    try:
        values = [_positive_int(x, MAX_CLIENTS) for x in text.split(",")]
    except argparse.ArgumentTypeError:
        values = []
    if not values or len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(
            f"expected a number of clients up to {MAX_CLIENTS} or a comma list of different "
            f"ones, got {text!r}"
        )
    return values


def _batch_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(x) for x in text.split(",")})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1 or sizes[-1] > MAX_PROFILE_BATCH:
        raise argparse.ArgumentTypeError(
            f"expected a comma list of batch sizes from 1 to {MAX_PROFILE_BATCH}, got {text!r}"
        )
    return sizes


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
    names = sorted(x.stem for x in BUNDLED_PROFILES.glob("*.json"))
    hint = did_you_mean(name, names)
    expected = f"a profile file or a shipped profile name (one of {', '.join(names)}{hint})"
    raise InputError("--profile", "", expected, name)


def _deployment_inputs(ns: argparse.Namespace) -> tuple[list[Any], list[Any], list[Any]]:
    """(profiles, all apps, apps named in --apps)."""
    from scheduler.deployment import Deployment
    from scheduler.profile import load_profile
    from scheduler.snapshot import load_apps, with_model_apps

    profiles = [load_profile(_profile_path(p)) for p in ns.profile]
    devices = sorted({p.device for p in profiles})
    if len(devices) > 1:  # one simulated device runs every model at its profile's speed
        expected = "profiles measured on one device (the models share one device here)"
        raise InputError("--profile", "", expected, " and ".join(devices))
    named = load_apps(ns.apps) if ns.apps else []
    apps = with_model_apps(profiles, named)
    Deployment(profiles, apps, source=ns.apps or "--profile")  # apps name known models
    return profiles, apps, named


def _build(ns: argparse.Namespace) -> tuple[Any, list[Any]]:
    from scheduler.deployment import DEFAULT_GROUPS, Deployment, groups_by_duration

    profiles, apps, named = _deployment_inputs(ns)
    source = ns.apps or "--profile"
    groups = groups_by_duration(profiles, ns.groups or DEFAULT_GROUPS, ns.min_group_ms)
    d = Deployment(profiles, apps, ns.max_batch, groups, source)
    return d, named


def _trace(ns: argparse.Namespace) -> Any:
    from traces.arrivals import load_timestamps

    if ns.arrival != "recorded":
        if ns.trace is not None:
            raise UsageError("layerbatch: --trace gives the arrivals of --arrival recorded only")
        return None
    return load_timestamps(ns.trace or BUNDLED_TRACE)


def _mix(ns: argparse.Namespace, d: Any, named: list[Any]) -> dict[str, float]:
    from sim.workload import parse_mix

    if ns.mix is None and named:
        return {a.name: 1.0 / len(named) for a in named}
    return parse_mix(ns.mix, d)


def _exact_only_for_dp(exact: bool, policies: Sequence[str]) -> None:
    if exact and not any(p in DP_POLICIES for p in policies):
        raise UsageError(
            f"layerbatch: --exact is the per-request form of {' and '.join(DP_POLICIES)}; "
            f"not with {', '.join(policies)}"
        )


def _simulated_policies_take(ns: argparse.Namespace, policies: Sequence[str]) -> None:
    """--exact and --admission-share only where some policy simulated uses them."""
    from scheduler.policies import DROPS_LATE

    _exact_only_for_dp(ns.exact, policies)
    if ns.admission_share is not None and not any(p in DROPS_LATE for p in policies):
        raise UsageError(
            "layerbatch: --admission-share is the door of policies that drop late requests "
            f"({', '.join(sorted(DROPS_LATE))}); not with {', '.join(policies)}"
        )


DP_POLICIES = ("dp-time", "dp-tardy")


# --- verbs ----------------------------------------------------------------------------------
def cmd_schedule(ns: argparse.Namespace) -> int:
    from scheduler.policies import make_policy
    from scheduler.snapshot import load_state, plan_to_json

    _exact_only_for_dp(ns.exact, [ns.policy])
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

    _simulated_policies_take(ns, [ns.policy])
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
        step_gap_ms=ns.step_gap_ms,
        replicas=ns.replicas,
        admission_share=ns.admission_share,
        decode_ms=ns.decode_ms,
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
    if bad or not policies or len(set(policies)) < len(policies):
        raise InputError(
            "--policies", "", f"a comma list of {', '.join(POLICY_CHOICES)}, each once", ns.policies
        )
    _simulated_policies_take(ns, policies)
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
        ns.step_gap_ms,
        ns.replicas,
        ns.admission_share,
        ns.decode_ms,
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
    if not ns.sim:
        if ns.requests is not None:
            raise UsageError("layerbatch: --requests counts simulated requests: give it with --sim")
        return server_demo(ns)
    if ns.duration is not None:
        raise UsageError("layerbatch: --duration is the server demo's: not with --sim")
    plot = ns.plot or _default_plot("out/demo-capacity.png")
    deadline_ms = ns.deadline_ms or 150.0
    rates = ",".join(f"{r:g}" for r in sorted(set(ns.rate))) if ns.rate else DEMO_SIM_RATES
    args = capacity_parser().parse_args(
        [
            "--profile",
            DEMO_PROFILE,
            "--policies",
            ",".join(POLICY_CHOICES),
            "--rates",
            rates,
            "--requests",
            str(ns.requests or 1500),
            "--deadline-ms",
            f"{deadline_ms!r}",
            "--plot",
            str(plot),
        ]
    )
    print(
        "layerbatch demo: the simulator runs every policy against the measured V100 block timings"
    )
    print(f"of {DEMO_PROFILE} (PPipe, TensorRT), Poisson arrivals, deadline {deadline_ms:g} ms.\n")
    print_capacity(run_capacity(args, progress=True))
    return 0


def _default_plot(path: str) -> Path:
    """`path`, checked as --plot would be (before the work, not after it)."""
    try:
        return _plot_file(path)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"layerbatch: --plot (default {path}): {exc}") from None


def server_demo(ns: argparse.Namespace) -> int:
    from client.demo import DEMO_APPS, DEMO_RATES_RPS, format_table, run_demo
    from server.wire import MAX_DEADLINE_MS

    too_fast = [r for r in ns.rate or [] if r > MAX_RATE_RPS]
    if too_fast:  # one load generator sends them all (a rate of 1e12 ran out of memory)
        expected = f"rates up to {MAX_RATE_RPS:g} req/s for the server demo (more: --sim)"
        raise InputError("--rate", "", expected, too_fast[0])
    if (ns.deadline_ms or 0.0) > MAX_DEADLINE_MS:  # the server refuses every such request
        expected = f"a deadline up to {MAX_DEADLINE_MS:.0f} ms, as the server takes (more: --sim)"
        raise InputError("--deadline-ms", "", expected, ns.deadline_ms)
    plot = ns.plot or _default_plot("out/demo-server.png")
    rates = sorted(set(ns.rate or DEMO_RATES_RPS))
    duration_s, deadline_ms = ns.duration or 6.0, ns.deadline_ms or 300.0
    print(f"layerbatch demo: the server on this machine ({os.cpu_count()} cores) serving")
    print(f"{', '.join(DEMO_APPS)}; the built-in load generator sends real video frames as JPEG")
    print(
        f"at {', '.join(f'{r:g}' for r in rates)} req/s (Poisson), deadline {deadline_ms:g} ms, "
        f"{duration_s:g} s per policy at each rate.\n"
    )
    rows = run_demo(rates_rps=rates, duration_s=duration_s, deadline_ms=deadline_ms, plot=plot)
    print(format_table(rows))
    table = Path(plot).with_suffix(".json")
    table.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"plot: {plot}\nrows: {table}")
    return 0


def cmd_profile(ns: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from layerexec import zoo
    from layerexec.allocator import keep_freed_memory
    from layerexec.memory import batch_bound
    from layerexec.profiler import max_abs_difference, profile_model, stacking_slowdown
    from scheduler.profile import dumps_profile, parse_profile

    if ns.out is None and not ns.verify:
        raise UsageError(
            "layerbatch: profile needs --out FILE (or --verify alone, to check the stages)"
        )
    if ns.model not in zoo.MODELS:
        raise InputError("--model", "", f"a model {_known_models(ns.model)}", ns.model)
    others = [m for m in ns.stack_with.split(",") if m]
    for m in others:
        if m not in zoo.MODELS:
            expected = f"a comma list of models {_known_models(m)}"
            raise InputError("--stack-with", "", expected, m)
    if ns.device == "cuda" and not torch.cuda.is_available():
        raise InputError(
            "--device", "", "cpu, or cuda on a machine with a GPU (none found)", "cuda"
        )
    torch.set_num_threads(ns.threads)
    keep_freed_memory()  # measured as the server runs (layerexec.allocator)
    model = zoo.load_model(ns.model)
    if ns.memory_mb is not None:  # refuse a budget that cannot hold one sample before measuring
        from layerexec.profiler import stage_peaks

        worst = max(stage_peaks(model, torch.device(ns.device), not ns.no_channels_last, 0))
        if batch_bound([worst], int(ns.memory_mb * 2**20), cap=1) < 1:
            need = f"a budget of at least {worst / 2**20:.2f} MB (one sample's activation peak)"
            raise InputError("--memory-mb", "", need, ns.memory_mb)
    if ns.verify:
        print(
            f"{ns.model}: {len(model.stages)} stages; largest |split - whole| = {max_abs_difference(model):.3g}"
        )
        if ns.out is None:
            return 0
    device_name = (
        f"{ns.device}-{ns.threads}t" if ns.device == "cpu" else torch.cuda.get_device_name(0)
    )
    total = len(ns.batch_sizes) * len(model.stages)
    with tqdm(total=total, desc=f"profiling {ns.model}", unit="stage", file=sys.stderr) as bar:
        doc = profile_model(
            model,
            ns.batch_sizes,
            time.perf_counter,
            ns.device,
            not ns.no_channels_last,
            ns.runs,
            ns.warmup,
            progress=bar.update,
            device_name=device_name,
            max_batch=ns.max_batch,
        )
    if ns.memory_mb is not None:
        peaks = [s["peak_bytes"] for s in doc["stages"]]
        doc["max_batch"] = batch_bound(peaks, int(ns.memory_mb * 2**20), cap=doc["max_batch"])
        doc["memory_budget_mb"] = ns.memory_mb
    if others:
        doc["stacking"] = {
            m: {
                "batch": 1,
                "slowdown": stacking_slowdown(
                    model,
                    zoo.load_model(m),
                    time.perf_counter,
                    device=ns.device,
                    channels_last=not ns.no_channels_last,
                ),
            }
            for m in others
        }
    parse_profile(doc, ns.out)  # what we write must read back
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dumps_profile(doc))
    solo = sum(s["latency_ms"][0] for s in doc["stages"])
    print(
        f"wrote {out}: {len(doc['stages'])} stages, {solo:.1f} ms at batch {ns.batch_sizes[0]}, max_batch {doc['max_batch']}"
    )
    return 0


def _known_models(misspelt: str) -> str:
    """ "layerexec knows (A, B, ...; did you mean X?)", for a refusal of a model it does not."""
    from layerexec import zoo

    names = sorted(zoo.MODELS)
    return f"layerexec knows ({', '.join(names)}{did_you_mean(misspelt, names)})"


def cmd_serve(ns: argparse.Namespace) -> int:
    from tqdm import tqdm

    from layerexec import zoo
    from layerexec.torch_thread import yield_to_torch
    from scheduler.profile import load_profile_of
    from server.app import make_app, serve
    from server.build import BUNDLED_PROFILES, DEFAULT_APPS, build_runtime, profile_path
    from server.config import ServerConfig

    def progress(model: str, total: int) -> Any:
        bar = tqdm(total=total, desc=f"measuring {model}", unit="stage", file=sys.stderr)
        return bar.update

    apps = [a.strip() for a in ns.apps.split(",") if a.strip()] if ns.apps else list(DEFAULT_APPS)
    if len(set(apps)) < len(apps):
        raise InputError("--apps", "", "a comma list of models, each once", ns.apps)
    unknown = [a for a in apps if a not in zoo.MODELS]
    if unknown or not apps:  # before "loading ...", which would say otherwise
        expected = f"a comma list of models {_known_models(unknown[0] if unknown else '')}"
        raise InputError("--apps", "", expected, ", ".join(unknown) or ns.apps)
    if ns.admin_token == "":
        raise InputError("--admin-token", "", "a non-empty token (or no --admin-token)", "")
    folder = Path(ns.profiles) if ns.profiles else BUNDLED_PROFILES
    for app in apps:  # a file of another model's is named now, not as the deployment's fault
        path = profile_path(folder, app)
        if path.exists():  # (a missing one is measured there once the model has loaded)
            load_profile_of(path, app, "the model --apps serves from this file")
    check_port_free(ns.host, ns.port)  # before the models load, which takes a while
    print(f"loading {', '.join(apps)} ...", file=sys.stderr)
    threads = ns.threads or max(1, ((os.cpu_count() or 2) - 1) // ns.replicas)
    runtime = build_runtime(
        apps, ns.policy, folder, ns.memory_mb,
        threads, max_queued=ns.max_queued, progress=progress, fold_batch_norm=ns.fold_bn,
        step_log=Path(ns.step_log) if ns.step_log else None, min_group_ms=ns.min_group_ms,
        replicas=ns.replicas, script=ns.script,
    )  # fmt: skip
    yield_to_torch()  # this thread runs the event loop; the models run on the runtime's thread
    config = ServerConfig(admin_token=ns.admin_token, default_deadline_ms=ns.deadline_ms)
    on = (
        f"{ns.replicas} replicas of {threads} torch threads"
        if ns.replicas > 1
        else f"{threads} torch threads"
    )
    print(
        f"layerbatch serving {', '.join(apps)} with {ns.policy} ({on}) on http://{ns.host}:{ns.port}",
        file=sys.stderr,
    )
    try:
        serve(make_app(runtime, config), ns.host, ns.port, shutdown_timeout=30.0)
    except OSError as exc:
        if exc.errno not in BIND_ERRORS:  # not the address: a fault to see whole
            raise
        raise UsageError(port_refused(ns.host, ns.port, exc)) from None  # taken since the check
    return 0


BIND_ERRORS = (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES)  # what binding can refuse


def check_port_free(host: str, port: int) -> None:
    """Raises UsageError, in one sentence, when the server could not listen on host:port."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, addr = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
            s.bind(addr)
    except OSError as exc:
        raise UsageError(port_refused(host, port, exc)) from None


def port_refused(host: str, port: int, exc: OSError) -> str:
    reason = (exc.strerror or str(exc)).lower()
    if exc.errno == errno.EADDRINUSE:
        reason += ": another server listens there; pick another --port"
    return (
        f"layerbatch serve: --host {host} --port {port}: expected an address this machine can "
        f"listen on, got {reason}"
    )


def cmd_client(ns: argparse.Namespace) -> int:
    from client.commands import client_command

    if ns.offload == "local" and (ns.uplink or ns.downlink):
        raise UsageError(
            "layerbatch client: --uplink and --downlink pace what is sent: with --offload local "
            "nothing is"
        )
    if ns.arrival == "poisson":
        if ns.rate is None or ns.fps is not None:
            raise UsageError("layerbatch client: --arrival poisson takes --rate R (not --fps)")
    elif ns.rate is not None:
        raise UsageError("layerbatch client: --rate needs --arrival poisson (or use --fps)")
    elif ns.fps is None:
        ns.fps = 10.0
    return client_command(ns)


def cmd_loadgen(ns: argparse.Namespace) -> int:
    from client.commands import loadgen_command

    if not ns.sweep and len(ns.clients) != 1:
        raise UsageError(
            "layerbatch loadgen: --clients: expected one number (a list needs --sweep)"
        )
    if ns.plot and not ns.sweep:
        raise UsageError("layerbatch loadgen: --plot draws a --sweep: give both, or neither")
    return loadgen_command(ns)


def cmd_linkshell(ns: argparse.Namespace) -> int:
    from client.linkshell import run_linkshell

    return run_linkshell(ns.uplink, ns.downlink, ns.listen, ns.upstream)


def cmd_traces(ns: argparse.Namespace) -> int:
    from traces.network import bundled_traces, load_trace

    for name, path in bundled_traces().items():
        t = load_trace(path)
        print(
            f"{name:<32} {t.period_ms / 1000:7.1f} s  mean {t.mean_mbps():6.2f} Mbit/s  {path.name}"
        )
    return 0


def cmd_plan(ns: argparse.Namespace) -> int:
    from scheduler.cloud import parse_workload, plan
    from scheduler.validate import read_json

    _plan_switches_apply(ns)
    workload = parse_workload(read_json(ns.workload, "workload"), ns.workload)
    t0 = time.perf_counter()
    doc = plan(
        workload, ns.system, dispatch=ns.dispatch,
        max_configs=None if ns.configs == "any" else int(ns.configs),
        dummy=not ns.no_dummy, reassign=not ns.no_reassign, split=ns.split,
        merge=False if ns.no_merge else None, cost_direct=False if ns.no_cost_direct else None,
        exchange=not ns.no_exchange,
    )  # fmt: skip
    doc["runtime_ms"] = round((time.perf_counter() - t0) * 1000.0, 3)
    if ns.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(f"cost {doc['cost']:.3f} per unit time, planned in {doc['runtime_ms']} ms")
    for app, latency in doc["e2e_latency_s"].items():
        print(f"  app {app}: end-to-end worst case {latency:.3f} s")
    for name, m in doc["modules"].items():
        configs = ", ".join(
            f"{c['machines']:g} x {c['hardware']} b{c['batch']} c{c['concurrency']}"
            for c in m["configs"]
        )
        print(f"  {name}: budget {m['budget_s']:.3f} s, worst {m['wcl_s']:.3f} s: {configs}")
    return 0


def _plan_switches_apply(ns: argparse.Namespace) -> None:
    """Refuse, before any work, a `plan` switch that would change nothing for --system (a
    feature it does not have, or that its --split does not run; `cloud.planner.switches_used`)."""
    from scheduler.cloud.planner import SYSTEMS, switches_used

    given = {
        "split": ns.split is not None, "dummy": ns.no_dummy, "reassign": ns.no_reassign,
        "merge": ns.no_merge, "cost_direct": ns.no_cost_direct, "exchange": ns.no_exchange,
    }  # fmt: skip
    used = switches_used(ns.system, ns.split)
    for switch, on in given.items():
        if not on or switch in used:
            continue
        flag = "--split" if switch == "split" else f"--no-{switch.replace('_', '-')}"
        users = [name for name in SYSTEMS if switch in switches_used(name)]
        step = " (its lc split)" if switch in ("merge", "cost_direct") else ""
        here = f"--split {ns.split}" if ns.system in users else f"--system {ns.system}"
        raise UsageError(
            f"layerbatch: {flag} applies to --system {', '.join(users)}{step} only; not with {here}"
        )


def cmd_pipeline_plan(ns: argparse.Namespace) -> int:
    import contextlib
    from collections.abc import Iterator

    from scheduler.pipeline.blocks import load_block_models
    from scheduler.pipeline.milp import Cluster, solve
    from scheduler.pipeline.shares import Workload, parse_named_numbers, solve_models
    from scheduler.validate import read_json

    twice = sorted({m for m in ns.model or [] if ns.model.count(m) > 1})
    if twice:
        raise InputError("--model", "", "each model once", ", ".join(twice))
    cluster = Cluster.from_json(read_json(ns.cluster, "cluster"), ns.cluster)
    models: list[ModelProfiles]
    if ns.profile:
        if ns.profiles or ns.model:
            raise UsageError("layerbatch: give --profile files or --profiles/--model, not both")
        groups = load_block_models(ns.profile, ns.blocks or 10, resolve=_profile_path)
        models = [g.profiles for g in groups]
    else:
        if ns.blocks is not None:
            raise UsageError(
                "layerbatch: --blocks groups --profile files (PPipe timings are blocks)"
            )
        models = [_ppipe_profiles(ns.profiles, name, cluster) for name in ns.model or ["repvgg-b3"]]
    names = [m.model for m in models]
    try:
        slo = {name: _positive_float(ns.slo_ms) for name in names}
    except argparse.ArgumentTypeError:
        if "=" not in ns.slo_ms:  # one number meant for every model
            expected = "a positive number of ms (or NAME=MS,... one per model)"
            raise InputError("--slo-ms", "", expected, ns.slo_ms) from None
        slo = parse_named_numbers(ns.slo_ms, "--slo-ms")
    shares = parse_named_numbers(ns.share, "--share") if ns.share else dict.fromkeys(names, 1.0)
    for flag, given in (("--slo-ms", slo), ("--share", shares)):
        if sorted(given) != sorted(names):
            raise InputError(flag, "", f"one value per model ({', '.join(names)})", sorted(given))

    @contextlib.contextmanager
    def solver_prints_to_stderr() -> Iterator[None]:
        """HiGHS may printf debug lines to fd 1; keep stdout (e.g. --json) clean."""
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(2, 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)

    def show(pipelines: list[dict[str, Any]]) -> None:
        for p in pipelines:
            parts = "  |  ".join(
                f"blocks {q['blocks'][0]}-{q['blocks'][1]} on {q['workers']} x "
                f"{q['gpu']}/{q['mps']}"
                for q in p["partitions"]
            )
            print(
                f"  {p['throughput_rps']:8.1f} req/s  batch {p['batch']}  "
                f"{p['latency_ms']:.1f} ms  {parts}"
            )

    if len(models) == 1:
        with solver_prints_to_stderr():
            plan = solve(
                models[0], cluster, slo[names[0]], ns.margin, ns.max_parts, ns.mps, ns.system,
                ns.time_limit_s, clock=time.perf_counter,
            )  # fmt: skip
        doc = plan.to_json()
        if ns.json:
            print(json.dumps(doc, indent=1))
            return _found(doc["throughput_rps"], doc["status"], ns.time_limit_s)
        gap = "-" if plan.gap is None else f"{plan.gap:.2g}"
        print(
            f"{names[0]} ({ns.system}): {doc['throughput_rps']:.1f} req/s, {doc['status']}, "
            f"gap {gap}, solved in {doc['solve_s']:.2f} s"
        )
        show(doc["pipelines"])
        return _found(doc["throughput_rps"], doc["status"], ns.time_limit_s)
    workloads = [Workload(m, shares[m.model], slo[m.model]) for m in models]
    with solver_prints_to_stderr():
        many = solve_models(
            workloads, cluster, ns.margin, ns.max_parts, ns.mps, ns.system, ns.time_limit_s,
            clock=time.perf_counter,
            progress=lambda line: print(f"layerbatch: {line} ...", file=sys.stderr, flush=True),
        )  # fmt: skip
    if ns.json:
        print(json.dumps(many.to_json(), indent=1))
        return _found(many.normalized_rps, many.status, ns.time_limit_s)
    print(
        f"{len(models)} models ({ns.system}): smallest throughput / share "
        f"{many.normalized_rps:.1f} req/s, total {many.throughput_rps:.1f} req/s, "
        f"{many.status}, gap {'-' if many.gap is None else f'{many.gap:.2g}'}, "
        f"solved in {many.solve_s or 0.0:.2f} s"
    )
    for name, entry in many.models.items():
        print(
            f" {name}: share {entry.share:g}, SLO {entry.slo_ms:g} ms, "
            f"{entry.plan.throughput_rps:.1f} req/s"
        )
        show(entry.plan.to_json()["pipelines"])
    return _found(many.normalized_rps, many.status, ns.time_limit_s)


def _found(served_rps: float, status: str, time_limit_s: float | None) -> int:
    """0 if the plan serves every model; else 1, after saying so (an empty plan is no plan)."""
    if served_rps > 0:
        return 0
    within = f" within --time-limit-s {time_limit_s:g}" if time_limit_s is not None else ""
    print(f"layerbatch: no plan serves every model{within} (solver: {status})", file=sys.stderr)
    return 1


def _ppipe_profiles(folder: str | None, model: str, cluster: Cluster) -> ModelProfiles:
    """`model`'s PPipe block timings on the cluster's GPU types, from `folder` (with its own
    transfer sizes) or, when None, the bundled ones."""
    from scheduler.pipeline.profiles import available_models, load_model_profiles

    if folder:
        return load_model_profiles(Path(folder), model, gpus=list(cluster.gpus))
    bundled = BUNDLED_PROFILES / "cloud"
    known = available_models(bundled / "ppipe")
    if model not in known:
        raise InputError(
            "--model", "", f"a model with bundled block timings ({', '.join(known)})", model
        )
    return load_model_profiles(
        bundled / "ppipe",
        model,
        gpus=list(cluster.gpus),
        transfer_dir=bundled / "ppipe-transfer-sizes",
    )


def cmd_pipeline_sim(ns: argparse.Namespace) -> int:
    import numpy as np

    from scheduler.pipeline.milp import Cluster
    from scheduler.validate import read_json
    from sim.pipeline_plan_file import plan_from_json
    from sim.pipeline_plane import PlaneConfig, load_factor_sweep, run_plane
    from traces.arrivals import load_timestamps

    if ns.trace is not None and ns.arrival != "trace":
        raise UsageError("layerbatch: --trace gives the arrivals of --arrival trace only")
    if ns.sweep and ns.load_factor is not None:
        raise UsageError("layerbatch: --sweep runs load factors 0.05..1.0: not with --load-factor")
    cluster = Cluster.from_json(read_json(ns.cluster, "cluster"), ns.cluster)
    profiles = _ppipe_profiles(ns.profiles, ns.model, cluster)
    doc = read_json(ns.plan, "pipeline plan")
    plan = plan_from_json(doc, profiles, cluster, ns.plan)
    if isinstance(doc, dict) and "model" not in doc and "models" not in doc:
        print(
            f"layerbatch: note: {ns.plan} does not say which model it was planned for (a plan "
            f"written before plans recorded it); simulating it as --model {ns.model}",
            file=sys.stderr,
        )
    if plan.slo_ms is not None and not math.isclose(plan.slo_ms, ns.slo_ms):
        print(
            f"layerbatch: note: {ns.plan} was planned for an SLO of {plan.slo_ms:g} ms; "
            f"simulating it at --slo-ms {ns.slo_ms:g}",
            file=sys.stderr,
        )
    if ns.load_factor is not None:
        _load_factor_fits(ns.load_factor, plan.throughput_rps, ns.duration_s)
    trace = load_timestamps(ns.trace or BUNDLED_TRACE) if ns.arrival == "trace" else None
    config = PlaneConfig(noise_sigma=ns.noise_sigma)
    rng = np.random.default_rng(ns.seed)
    if ns.sweep:
        sweep = load_factor_sweep(
            profiles, cluster, plan, ns.slo_ms, ns.policy, ns.arrival, ns.duration_s, rng,
            trace_s=trace, config=config,
        )  # fmt: skip
        if ns.json:
            print(json.dumps(sweep.to_json(), indent=1))
            return 0
        print(
            f"{ns.model} {ns.policy}, {ns.arrival} arrivals, {ns.duration_s:g} s per load factor "
            f"(plan {plan.throughput_rps:.1f} req/s)"
        )
        for pt in sweep.points:
            print(
                f"  load {pt.load_factor:4.2f}  {pt.rate_rps:8.1f} req/s  attainment "
                f"{pt.attainment:.4f}  dropped {pt.dropped}"
            )
        best = "none" if sweep.max_load_factor is None else f"{sweep.max_load_factor:.2f}"
        print(f"highest load factor with attainment >= 0.99: {best}")
        return 0
    res = run_plane(
        profiles, cluster, plan, ns.slo_ms, ns.policy, ns.arrival, ns.load_factor or 0.9,
        ns.duration_s, rng, trace_s=trace, config=config,
    )  # fmt: skip
    if ns.json:
        print(json.dumps(res.to_json(), indent=1))
        return 0
    util = ", ".join(f"{g} {u:.2f}" for g, u in sorted(res.utilisation.items()))
    p50 = "-" if res.p50_ms is None else f"{res.p50_ms:.1f}"
    p99 = "-" if res.p99_ms is None else f"{res.p99_ms:.1f}"
    print(
        f"{ns.model} {ns.policy}, {ns.arrival} at {res.load_factor:g} x {plan.throughput_rps:.1f}"
        f" = {res.rate_rps:.1f} req/s for {res.duration_s:g} s: attainment {res.attainment:.4f}"
    )
    print(
        f"  {res.requests} requests, {res.on_time} on time, {res.late} late, {res.dropped} "
        f"dropped; p50 {p50} ms, p99 {p99} ms; {res.batches} batches"
        + ("" if res.mean_batch is None else f" (mean {res.mean_batch:.2f})")
    )
    print(f"  utilisation: {util}")
    return 0


MIN_EXPECTED_REQUESTS = 10.0  # in a `pipeline sim` run (as its own "give 10 / rate s" says)


def _load_factor_fits(load_factor: float, plan_rps: float, duration_s: float) -> None:
    """Refuse, naming --load-factor, one at which the plan's throughput gives a rate outside
    the simulator's range or fewer than MIN_EXPECTED_REQUESTS expected within --duration-s
    (--load-factor 1e-300 was named as a --rate no one gave, 1e-6 as a --duration-s too short;
    at 1e-3 a run of a second held one request, or none)."""
    if not (plan_rps > 0 and math.isfinite(plan_rps)):  # a plan serving nothing: named later
        return
    rate = load_factor * plan_rps
    high = min(MAX_LOAD_FACTOR, MAX_SIM_RATE_RPS / plan_rps)
    low = max(MIN_SIM_RATE_RPS, MIN_EXPECTED_REQUESTS / duration_s) / plan_rps
    plan = f"this plan's {plan_rps:.1f} req/s"
    few = f"{MIN_EXPECTED_REQUESTS:g} requests"
    if MIN_SIM_RATE_RPS <= rate <= MAX_SIM_RATE_RPS and rate * duration_s < MIN_EXPECTED_REQUESTS:
        factor = f"--load-factor to {_up(low)} (up to {high:.3g}) or " if low <= high else ""
        raise UsageError(
            f"layerbatch: at --load-factor {load_factor:g} of {plan}, fewer than {few} "
            f"({rate * duration_s:.3g}) are expected within --duration-s {duration_s:g}; raise "
            f"{factor}--duration-s to {_up(MIN_EXPECTED_REQUESTS / rate)} s"
        )
    if not MIN_SIM_RATE_RPS <= rate <= MAX_SIM_RATE_RPS:  # no --duration-s mends these
        why = f", so that {few} or more are expected within --duration-s {duration_s:g}"
        if low > high:  # and --duration-s is too short for any
            low = MIN_SIM_RATE_RPS / plan_rps
            why = f" (simulated rates start at {MIN_SIM_RATE_RPS:g} req/s)"
        expected = f"a load factor from {_up(low)} to {high:.3g} of {plan}{why}"
        raise InputError("--load-factor", "", expected, load_factor)


def _up(x: float) -> str:
    """`x` to three significant digits, rounded up: a lower bound that, given, passes."""
    unit = 10.0 ** (math.floor(math.log10(x)) - 2)
    return f"{math.ceil(x / unit) * unit:.3g}"


def cmd_models(ns: argparse.Namespace) -> int:
    from layerexec import zoo

    for name, s in zoo.MODELS.items():
        print(f"{name:<32} {s.kind:<14} input {'x'.join(map(str, s.input_shape)):<12} {s.weights}")
    return 0


def cmd_profiles(ns: argparse.Namespace) -> int:
    from scheduler.profile import load_profile

    paths = sorted(BUNDLED_PROFILES.glob("*.json"))
    width = max((len(path.stem) for path in paths), default=0)  # one column however long a name
    for path in paths:
        p = load_profile(path)
        solo = sum(p.batch1_ms)
        print(
            f"{path.stem:<{width}} {p.device:<22} {p.num_stages:>3} stages  batch-1 {solo:7.2f} ms  max_batch {p.max_batch}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""PPipe's data plane, simulated: SLO attainment of a pipeline plan against load (paper 004,
sections 5.4, 7.1-7.4 and Appendix A.3).

Requests arrive over [0, duration) at rate = load factor x the plan's throughput (Poisson, or the
Azure trace rescaled to that mean rate); request r has deadline arrival_r + SLO. A policy
(`sim.pipeline_policies`: "ppipe", Algorithm 1 over reservation tables, or "reactive", per-pool
queues) forms batches; `sim.pipeline_exec` runs them on the plan's workers and NIC links
(`sim.pipeline_layout`), GPU times profiled(b) x slowdown x a log-normal factor of mean 1 and
shape sigma. The run goes on until every request has finished or been dropped.

Metrics: attainment = requests finished by their deadline / requests arrived (`run_plane`
refuses a run in which no request arrives; `summarise` gives nan for one, never 1); drops;
p50/p99 latency of finished requests; per GPU class k utilisation =
sum over its workers of busy time inside [0, duration) / m, over N_k x duration (N_k the
cluster's count of k, so it lies in [0, 1]). `load_factor_sweep` runs load factors 0.05..1.0 in
steps of 0.05 and reports the highest with attainment >= 0.99 (None if none).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scheduler.errors import InputError
from scheduler.pipeline.milp import Cluster, PipelinePlan
from scheduler.pipeline.profiles import ModelProfiles
from sim.pipeline_exec import ARRIVAL, DONE, GPU_TASK, RETRY, WAKE, Events, Executor, Noise, Task
from sim.pipeline_layout import Layout, place
from sim.pipeline_policies import PPipePolicy, ReactivePolicy, Requests, Timing
from traces.arrivals import generate_ms, load_timestamps

POLICIES = ("ppipe", "reactive")
ARRIVALS = ("poisson", "trace", "constant", "pareto")
LOAD_FACTORS = tuple(round(0.05 * k, 2) for k in range(1, 21))
ATTAINMENT_TARGET = 0.99
MAX_ARRIVALS = 10**7  # requests in one run: about a GB of arrays
# GPU time noise: at sigma 1 a task's time factor is more than e times off its median about one
# time in three; the median is exp(-sigma^2 / 2), so at 1000 no task took any time, and past
# a sigma of about 1e154 its square overflowed
MAX_NOISE_SIGMA = 1.0
AZURE_TRACE = (
    Path(__file__).resolve().parents[1]
    / "traces"
    / "data"
    / "request_traces"
    / "AzureLLMInferenceTrace_code.csv"
)


@dataclass(frozen=True)
class PlaneConfig:
    """Knobs of a run. `noise_sigma`/`slowdown`: GPU time factor (see module docstring);
    `ewma`: weight of the newest measurement in PPipe's feedback correction; `guard`: share of
    the SLO PPipe keeps between a batch's predicted finish and its oldest deadline; `fallback`:
    PPipe tries the other pipelines before dropping (not in Algorithm 1, off by default)."""

    noise_sigma: float = 0.02
    slowdown: float = 1.0
    ewma: float = 0.2
    guard: float = 0.02
    fallback: bool = False

    def check(self) -> None:
        if not 0 <= self.noise_sigma <= MAX_NOISE_SIGMA:
            expected = f"a sigma from 0 to {MAX_NOISE_SIGMA:g}"
            raise InputError("sim", "noise_sigma", expected, self.noise_sigma)
        if not (self.slowdown > 0 and math.isfinite(self.slowdown)):
            raise InputError("sim", "slowdown", "a positive factor", self.slowdown)
        if not 0 < self.ewma <= 1:
            raise InputError("sim", "ewma", "a weight in (0, 1]", self.ewma)
        if not 0 <= self.guard < 1:
            raise InputError("sim", "guard", "a share of the SLO in [0, 1)", self.guard)


@dataclass(frozen=True)
class PlaneOutcome:
    """Per request what happened (finish_ms nan: not finished), and the run's counters."""

    arrival_ms: np.ndarray
    deadline_ms: np.ndarray
    finish_ms: np.ndarray
    dropped: np.ndarray
    batch_sizes: tuple[int, ...]
    busy_gpu_ms: dict[str, float]  # per GPU class: busy virtual-GPU ms / m inside the window
    window_ms: float
    probes: int
    correction: tuple[tuple[float, ...], ...]  # PPipe's final EWMA per pool (1 for reactive)


@dataclass(frozen=True)
class PlaneResult:
    """One run's numbers (`to_json` is the `layerbatch pipeline sim --json` document)."""

    policy: str
    arrival: str
    load_factor: float
    rate_rps: float
    duration_s: float
    requests: int
    on_time: int
    late: int
    dropped: int
    attainment: float
    p50_ms: float | None
    p99_ms: float | None
    batches: int
    mean_batch: float | None
    probes_per_batch: float | None
    utilisation: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "arrival": self.arrival,
            "load_factor": self.load_factor,
            "rate_rps": _r(self.rate_rps),
            "duration_s": self.duration_s,
            "requests": self.requests,
            "on_time": self.on_time,
            "late": self.late,
            "dropped": self.dropped,
            "attainment": _r(self.attainment),
            "p50_ms": _r_opt(self.p50_ms),
            "p99_ms": _r_opt(self.p99_ms),
            "batches": self.batches,
            "mean_batch": _r_opt(self.mean_batch),
            "probes_per_batch": _r_opt(self.probes_per_batch),
            "utilisation": {k: _r(v) for k, v in sorted(self.utilisation.items())},
        }


@dataclass(frozen=True)
class SweepResult:
    """Attainment per load factor and the highest load factor meeting the target."""

    policy: str
    arrival: str
    duration_s: float
    plan_throughput_rps: float
    points: tuple[PlaneResult, ...]
    max_load_factor: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "arrival": self.arrival,
            "duration_s": self.duration_s,
            "plan_throughput_rps": _r(self.plan_throughput_rps),
            "target": ATTAINMENT_TARGET,
            "max_load_factor": self.max_load_factor,
            "points": [p.to_json() for p in self.points],
        }


def _r(x: float) -> float:
    return round(float(x), 4)


def _r_opt(x: float | None) -> float | None:
    return None if x is None else _r(x)


def make_timing(
    profiles: ModelProfiles, cluster: Cluster, plan: PipelinePlan, layout: Layout
) -> Timing:
    """Profiled compute and transfer times of every pool at batches 1..its pipeline's batch."""
    bits_per_ms = cluster.nic_gbps * 1e9 / 1000.0
    compute, transfer = [], []
    for pipe, pools in zip(plan.pipelines, layout.pools, strict=True):
        comp_rows, net_rows = [], []
        for pool in pools:
            start, stop = pool.blocks
            comp_rows.append(
                (0.0,)
                + tuple(
                    profiles.partition_latency_ms(pool.gpu, pool.mps, start, stop, b)
                    for b in range(1, pipe.batch + 1)
                )
            )
            cut_bits = 8 * profiles.cut_bytes[start - 1] if start > 0 else 0
            net_rows.append(tuple(b * cut_bits / bits_per_ms for b in range(pipe.batch + 1)))
        compute.append(tuple(comp_rows))
        transfer.append(tuple(net_rows))
    return Timing(
        tuple(compute),
        tuple(transfer),
        tuple(p.batch for p in plan.pipelines),
        tuple(p.throughput_rps for p in plan.pipelines),
    )


def simulate(
    profiles: ModelProfiles,
    cluster: Cluster,
    plan: PipelinePlan,
    slo_ms: float,
    arrival_ms: np.ndarray,
    policy: str,
    rng: np.random.Generator,
    config: PlaneConfig | None = None,
    window_ms: float | None = None,
) -> PlaneOutcome:
    """Run the given arrivals (ms, sorted) through `plan` under `policy` until all are done.

    `window_ms` (default: the last arrival) bounds the time utilisation is counted over; `rng`
    draws the GPU time noise. Raises InputError for an unknown policy, a bad SLO or config, or
    a plan that does not fit the cluster.
    """
    config = config or PlaneConfig()
    config.check()
    if policy not in POLICIES:
        raise InputError("sim", "policy", f"one of {', '.join(POLICIES)}", policy)
    if not (slo_ms > 0 and math.isfinite(slo_ms)):
        raise InputError("sim", "slo_ms", "a positive number of milliseconds", slo_ms)
    layout = place(plan, cluster)
    timing = make_timing(profiles, cluster, plan, layout)
    arrivals = np.asarray(arrival_ms, dtype=np.float64)
    n = arrivals.size
    req = Requests(arrivals, arrivals + slo_ms, np.full(n, np.nan), np.zeros(n, dtype=bool))
    window = float(window_ms if window_ms is not None else (arrivals[-1] if n else 0.0))
    busy: dict[str, float] = {g: 0.0 for g, pool in cluster.gpus.items() if pool.count > 0}
    worker_class = {w.gpu: (pool.gpu, pool.mps) for w, pool in layout.workers()}
    events = Events()
    pol: PPipePolicy | ReactivePolicy | None = None

    def on_start(task: Task, now_ms: float) -> None:
        assert pol is not None
        pol.started(task, now_ms)

    def on_done(task: Task, now_ms: float) -> None:
        assert pol is not None
        if task.kind == GPU_TASK:
            gpu, mps = worker_class[task.resources[0]]
            inside = min(task.end_ms, window) - min(task.start_ms, window)
            busy[gpu] += inside / mps
        pol.done(task, now_ms)

    executor = Executor(
        layout.resources, events, rng, Noise(config.noise_sigma, config.slowdown), on_start, on_done
    )
    if policy == "ppipe":
        pol = PPipePolicy(
            layout,
            timing,
            req,
            executor,
            events,
            config.guard * slo_ms,
            config.ewma,
            config.fallback,
        )
    else:
        pol = ReactivePolicy(layout, timing, req, executor)
    for rid in range(n):
        events.push(float(arrivals[rid]), ARRIVAL, rid)
    while events:
        now_ms, kind, payload = events.pop()
        if kind == DONE:
            assert isinstance(payload, Task)
            executor.finish(payload, now_ms)
        elif kind == RETRY:
            assert isinstance(payload, Task)
            executor.try_start(payload, now_ms)
        elif kind == ARRIVAL:
            assert isinstance(payload, int)
            rids = [payload]
            while events.peek() == (now_ms, ARRIVAL):  # arrivals at one time come together
                nxt = events.pop()[2]
                assert isinstance(nxt, int)
                rids.append(nxt)
            pol.arrive(rids, now_ms)
        elif kind == WAKE:
            pol.wake(payload, now_ms)
    correction = (
        tuple(tuple(row) for row in pol.correction)
        if isinstance(pol, PPipePolicy)
        else tuple(tuple(1.0 for _ in pipe) for pipe in layout.pools)
    )
    return PlaneOutcome(
        arrivals,
        req.deadline_ms,
        req.finish_ms,
        req.dropped,
        tuple(pol.batch_sizes),
        busy,
        window,
        pol.probes,
        correction,
    )


def summarise(
    out: PlaneOutcome,
    cluster: Cluster,
    policy: str,
    arrival: str,
    load_factor: float,
    rate_rps: float,
) -> PlaneResult:
    """The numbers of the module docstring from one outcome."""
    n = out.arrival_ms.size
    done = ~np.isnan(out.finish_ms)
    latency = (out.finish_ms - out.arrival_ms)[done]
    on_time = int(np.sum(out.finish_ms[done] <= out.deadline_ms[done] + 1e-9))
    util = {
        gpu: (busy / (cluster.gpus[gpu].count * out.window_ms) if out.window_ms > 0 else 0.0)
        for gpu, busy in out.busy_gpu_ms.items()
    }
    batches = len(out.batch_sizes)
    return PlaneResult(
        policy=policy,
        arrival=arrival,
        load_factor=load_factor,
        rate_rps=rate_rps,
        duration_s=out.window_ms / 1000.0,
        requests=n,
        on_time=on_time,
        late=int(np.sum(done)) - on_time,
        dropped=int(np.sum(out.dropped)),
        attainment=on_time / n if n else math.nan,
        p50_ms=float(np.percentile(latency, 50)) if latency.size else None,
        p99_ms=float(np.percentile(latency, 99)) if latency.size else None,
        batches=batches,
        mean_batch=float(np.mean(out.batch_sizes)) if batches else None,
        probes_per_batch=out.probes / batches if batches and policy == "ppipe" else None,
        utilisation=util,
    )


def arrivals_ms(
    kind: str,
    rate_rps: float,
    duration_s: float,
    rng: np.random.Generator,
    trace_s: np.ndarray | None = None,
) -> np.ndarray:
    """Arrival times in [0, duration_s) ms at mean rate `rate_rps` (`trace`: the recorded
    timestamps `trace_s`, default the bundled Azure trace, rescaled and looped)."""
    if kind not in ARRIVALS:
        raise InputError("sim", "arrival", f"one of {', '.join(ARRIVALS)}", kind)
    if not (rate_rps > 0 and math.isfinite(rate_rps)):
        raise InputError("sim", "rate_rps", "a positive request rate", rate_rps)
    if not (duration_s > 0 and math.isfinite(duration_s)):
        raise InputError("sim", "duration_s", "a positive number of seconds", duration_s)
    window_ms = duration_s * 1000.0
    expect = rate_rps * duration_s
    n = int(expect + 10 * math.sqrt(expect) + 100)
    if kind == "trace":
        ts = trace_s if trace_s is not None else load_timestamps(AZURE_TRACE)
        while True:
            out = generate_ms("recorded", rate_rps, n, rng, ts)
            if out[-1] >= window_ms:
                return out[out < window_ms]
            n *= 2
    out = generate_ms(kind, rate_rps, n, rng)
    while out[-1] < window_ms:  # heavy tails: draw more, continuing from the last
        more = generate_ms(kind, rate_rps, n, rng) + out[-1]
        out = np.concatenate([out, more])
    return out[out < window_ms]


def run_plane(
    profiles: ModelProfiles,
    cluster: Cluster,
    plan: PipelinePlan,
    slo_ms: float,
    policy: str,
    arrival: str,
    load_factor: float,
    duration_s: float,
    rng: np.random.Generator,
    *,
    trace_s: np.ndarray | None = None,
    config: PlaneConfig | None = None,
) -> PlaneResult:
    """One run at rate load_factor x plan throughput for `duration_s` seconds; InputError
    naming --duration-s if no request arrives in it (attainment would mean nothing).

    `rng` is split in two: the first child draws the arrivals, the second the GPU noise, so two
    policies given equally seeded generators see the same requests.
    """
    if not (load_factor > 0 and math.isfinite(load_factor)):
        raise InputError("sim", "load_factor", "a positive number", load_factor)
    arrivals_rng, noise_rng = rng.spawn(2)
    rate_rps = load_factor * plan.throughput_rps
    if rate_rps * duration_s > MAX_ARRIVALS:
        raise InputError(
            "--duration-s",
            "",
            f"a run of at most {MAX_ARRIVALS} requests ({MAX_ARRIVALS / rate_rps:.3g} s at "
            f"{rate_rps:.1f} req/s)",
            duration_s,
        )
    arrivals = arrivals_ms(arrival, rate_rps, duration_s, arrivals_rng, trace_s)
    if arrivals.size == 0:
        raise InputError(
            "--duration-s",
            "",
            f"a run in which requests arrive (none arrived in {duration_s:g} s at "
            f"{rate_rps:.1f} req/s; give {10.0 / rate_rps:.3g} s or more)",
            duration_s,
        )
    out = simulate(
        profiles, cluster, plan, slo_ms, arrivals, policy, noise_rng, config, duration_s * 1000.0
    )
    return summarise(out, cluster, policy, arrival, load_factor, rate_rps)


def load_factor_sweep(
    profiles: ModelProfiles,
    cluster: Cluster,
    plan: PipelinePlan,
    slo_ms: float,
    policy: str,
    arrival: str,
    duration_s: float,
    rng: np.random.Generator,
    *,
    factors: Sequence[float] = LOAD_FACTORS,
    trace_s: np.ndarray | None = None,
    config: PlaneConfig | None = None,
) -> SweepResult:
    """`run_plane` at every load factor, each with its own child of `rng` (in order)."""
    if not factors:
        raise InputError("sim", "factors", "at least one load factor", list(factors))
    if arrival == "trace" and trace_s is None:
        trace_s = load_timestamps(AZURE_TRACE)
    children = rng.spawn(len(factors))
    points = tuple(
        run_plane(
            profiles,
            cluster,
            plan,
            slo_ms,
            policy,
            arrival,
            f,
            duration_s,
            child,
            trace_s=trace_s,
            config=config,
        )
        for f, child in zip(factors, children, strict=True)
    )
    good = [p.load_factor for p in points if p.attainment >= ATTAINMENT_TARGET]
    return SweepResult(
        policy, arrival, duration_s, plan.throughput_rps, points, max(good) if good else None
    )

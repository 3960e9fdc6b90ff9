"""Shared builders, strategies and independent checkers for the scheduler policy tests.

Used by tests/test_policies.py, tests/test_multi_app.py and tests/test_dp_optimality.py.
Everything here recomputes what a plan means from the deployment's latency table alone
(`Deployment.latency_ms`), without `scheduler.timeline`, so the checks do not trust the code
they check.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import strategies as st

from scheduler import App, Deployment, Plan, Request, SchedulerState, parse_profile
from scheduler.profile import Profile
from scheduler.segments import walk
from scheduler.types import Action

# pytest stash key: (dp-time exact objective / best objective over all schedules) per case,
# filled by tests/test_dp_optimality.py and summarised by tests/conftest.py.
DP_GAP_KEY = pytest.StashKey[list[float]]()
HEURISTIC_KEY = pytest.StashKey[list[float]]()

BATCH_SIZES = (1, 2, 4, 8)


# --- building deployments ---------------------------------------------------------------------
def make_profile(
    model: str,
    latency: Sequence[Sequence[float]],
    batch_sizes: Sequence[int] = BATCH_SIZES,
    max_batch: int = 32,
) -> Profile:
    """A `layerbatch.profile/1` profile: `latency[k][i]` is stage k's latency at batch_sizes[i]."""
    doc = {
        "format": "layerbatch.profile/1",
        "model": model,
        "device": "test",
        "input": {"shape": [3, 8, 8], "dtype": "float32"},
        "batch_sizes": list(batch_sizes),
        "stages": [
            {"name": f"{model}.s{k}", "latency_ms": list(row), "out_bytes": 0}
            for k, row in enumerate(latency)
        ],
        "max_batch": max_batch,
    }
    return parse_profile(doc, f"{model}.json")


def req(
    rid: str,
    app: str,
    position: int,
    arrival_ms: float = 0.0,
    deadline_ms: float = math.inf,
) -> Request:
    return Request(rid, app, position, arrival_ms, deadline_ms)


def state_of(d: Deployment, requests: Iterable[Request]) -> SchedulerState:
    return SchedulerState(d, list(requests))


# --- hypothesis strategies ---------------------------------------------------------------------
@st.composite
def latency_rows(draw: Any, stages: int, strict: bool = False) -> list[list[float]]:
    """Per stage, latencies at BATCH_SIZES that never decrease with the batch size
    (strictly increase with `strict`)."""
    rows = []
    for _ in range(stages):
        h = draw(st.integers(1, 20)) / 2.0
        row = [h]
        for _ in BATCH_SIZES[1:]:
            step = draw(st.integers(1 if strict else 0, 12)) / 2.0
            h += step
            row.append(h)
        rows.append(row)
    return rows


@dataclass
class Case:
    """One random scheduling situation."""

    deployment: Deployment
    requests: list[Request]
    now_ms: float

    def state(self) -> SchedulerState:
        return state_of(self.deployment, self.requests)

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        d = self.deployment
        prof = {
            m: [list(s.latency_ms) for s in p.stages] + [f"pmax={p.max_batch}"]
            for m, p in d.profiles.items()
        }
        apps = {a.name: a.models for a in d.apps.values()}
        return (
            f"Case(now={self.now_ms}, max_batch={d.max_batch_cap}, groups={d.groups},\n"
            f"  profiles={prof},\n  apps={apps},\n  requests={self.requests})"
        )


@st.composite
def cases(
    draw: Any,
    max_models: int = 3,
    max_requests: int = 25,
    shared: bool = True,
    deadlines: bool = True,
    no_deadline: bool = True,
) -> Case:
    """1..max_models models (1-6 stages, monotone latencies) and requests at random positions
    with random arrivals and deadlines (some already expired; with `no_deadline`, some none).

    With `shared`, the apps are every model alone plus chains that share models with them
    (c01 = m0 -> m1, c02 = m0 -> m2, c21 = m2 -> m1); without, m0 alone and a chain c12 = m1 -> m2
    (or m1 alone), so no two apps share a model."""
    n_models = draw(st.integers(1, max_models))
    profiles = []
    for m in range(n_models):
        stages = draw(st.integers(1, 6))
        profiles.append(
            make_profile(f"m{m}", draw(latency_rows(stages)), max_batch=draw(st.integers(4, 16)))
        )
    apps = [App(p.model, (p.model,)) for p in profiles]
    if not shared:
        apps = apps[:2] if n_models < 3 else [apps[0], App("c12", ("m1", "m2"))]
    elif n_models >= 2:
        apps.append(App("c01", ("m0", "m1")))  # a chain; shares m0 and m1 with the single apps
        if n_models >= 3:
            apps.append(App("c02", ("m0", "m2")))  # shares m0 with c01 and m0
            apps.append(App("c21", ("m2", "m1")))  # shares m1 at its second model
    d = Deployment(
        profiles, apps, max_batch=draw(st.integers(1, 8)), groups=draw(st.integers(1, 5))
    )
    now = float(draw(st.integers(0, 50)))
    n_req = draw(st.integers(0, max_requests))
    requests = []
    names = sorted(d.apps)
    for n in range(n_req):
        app = draw(st.sampled_from(names))
        pos = draw(st.integers(0, d.app_length(app) - 1))
        arrival = now - draw(st.integers(0, 60))
        if deadlines:
            kinds = (
                ["none", "expired", "tight", "loose"]
                if no_deadline
                else ["expired", "tight", "loose"]
            )
            kind = draw(st.sampled_from(kinds))
            deadline = {
                "none": math.inf,
                "expired": now - draw(st.integers(0, 5)),
                "tight": now + draw(st.integers(1, 60)),
                "loose": now + draw(st.integers(60, 400)),
            }[kind]
        else:
            deadline = math.inf
        requests.append(req(f"r{n}", app, pos, float(arrival), float(deadline)))
    return Case(d, requests, now)


# --- replaying plans independently -------------------------------------------------------------
@dataclass
class Replay:
    completion: dict[str, float]
    positions: dict[str, int]
    # per executed stage: (model, stage, frozenset of request ids, start_ms, end_ms)
    steps: list[tuple[str, int, frozenset[str], float, float]]
    # per action: (start_ms, end_ms)
    spans: list[tuple[float, float]]
    # request id -> index of the action that finishes it
    finish_index: dict[str, int]


def my_replay(
    d: Deployment, requests: Sequence[Request], now_ms: float, actions: Sequence[Action]
) -> Replay:
    """Run `actions` back to back from `now_ms` using only `d.latency_ms`; assert each action is
    runnable as written (known model and stages, distinct active requests standing at its first
    stage, batch within the model's bound)."""
    pos = {r.id: r.position for r in requests}
    app = {r.id: r.app for r in requests}
    completion: dict[str, float] = {}
    steps: list[tuple[str, int, frozenset[str], float, float]] = []
    spans: list[tuple[float, float]] = []
    finish_index: dict[str, int] = {}
    t = now_ms
    for n, act in enumerate(actions):
        assert act.model in d.profiles, f"action {n}: unknown model {act.model}"
        k0, k1 = act.stages
        assert 0 <= k0 < k1 <= d.profiles[act.model].num_stages, f"action {n}: {act}"
        ids = act.request_ids
        assert ids and len(set(ids)) == len(ids), f"action {n}: empty or repeated ids {ids}"
        b = len(ids)
        assert b <= d.batch_limit(act.model), f"action {n}: batch {b} > B"
        if d.max_batch_cap is not None:
            assert b <= d.max_batch_cap
        for rid in ids:
            assert rid in pos, f"action {n}: {rid} is not a planned request"
            assert rid not in completion, f"action {n}: {rid} already finished"
            offset = None
            for m, o in _offsets(d, app[rid]):
                if m == act.model:
                    offset = o
            assert offset is not None, f"action {n}: {rid}'s app does not run {act.model}"
            assert pos[rid] == offset + k0, (
                f"action {n}: {rid} at {pos[rid]}, not {act.model}[{k0}]"
            )
        start = t if act.not_before_ms is None else max(t, act.not_before_ms)
        s = start
        for k in range(k0, k1):
            lat = d.latency_ms(act.model, k, b)
            assert math.isfinite(lat)
            steps.append((act.model, k, frozenset(ids), s, s + lat))
            s += lat
        t = start + sum(d.latency_ms(act.model, k, b) for k in range(k0, k1))
        spans.append((start, t))
        for rid in ids:
            pos[rid] += k1 - k0
            if pos[rid] >= d.app_length(app[rid]):
                completion[rid] = t
                finish_index[rid] = n
    return Replay(completion, pos, steps, spans, finish_index)


def _offsets(d: Deployment, app: str) -> list[tuple[str, int]]:
    out, off = [], 0
    for m in d.apps[app].models:
        out.append((m, off))
        off += d.profiles[m].num_stages
    return out


TIME_OBJECTIVE = ("nobatch", "dynamic", "batch", "nexus", "dp-time")


def check_plan(state: SchedulerState, now_ms: float, plan: Plan, policy: str) -> Replay:
    """Every guarantee of a `Plan`, checked from scratch; returns the replay."""
    d = state.deployment
    reqs = state.requests()
    ids = {r.id for r in reqs}
    dropped = list(plan.dropped_ids)
    assert len(set(dropped)) == len(dropped), "a request dropped twice"
    assert set(dropped) <= ids
    for r in reqs:
        if r.deadline_ms <= now_ms:
            assert r.id in dropped, f"{policy}: expired {r.id} not dropped"
    for drop in plan.dropped:
        assert drop.reason, "a drop without a reason"
    kept = [r for r in reqs if r.id not in set(dropped)]
    for act in plan.actions:
        assert not set(act.request_ids) & set(dropped), f"{policy}: dropped request runs: {act}"
    rep = my_replay(d, kept, now_ms, plan.actions)
    assert set(rep.completion) == {r.id for r in kept}, f"{policy}: unfinished requests"
    assert set(plan.completion_ms) == set(rep.completion)
    for rid, c in rep.completion.items():
        assert math.isfinite(c), f"{policy}: {rid} never finishes"
        assert plan.completion_ms[rid] == pytest.approx(c, rel=1e-12, abs=1e-9), rid
    total = sum(c - now_ms for c in rep.completion.values())
    if policy in TIME_OBJECTIVE:
        assert plan.objective == pytest.approx(total, rel=1e-9, abs=1e-9)
    elif policy == "edf":
        late = sum(1 for r in kept if rep.completion[r.id] > r.deadline_ms)
        assert plan.objective == late + len(dropped)
    elif policy == "dp-tardy":
        assert plan.objective == len(dropped)
    return rep


def misses(state: SchedulerState, plan: Plan) -> int:
    """Requests not served on time: dropped, or finished after their deadline."""
    late = sum(
        1
        for r in state
        if r.id not in plan.dropped_ids and plan.completion_ms[r.id] > r.deadline_ms
    )
    return late + len(plan.dropped)


def total_ms(completion: dict[str, float], now_ms: float) -> float:
    return sum(c - now_ms for c in completion.values())


# --- exhaustive searches over one app -----------------------------------------------------------
def furthest_first(requests: Sequence[Request]) -> list[Request]:
    return sorted(requests, key=lambda r: (-r.position, r.arrival_ms, r.id))


def segmentations(n: int) -> Iterable[list[tuple[int, int]]]:
    """Every way to cut 0..n-1 into contiguous runs, as [(first, last)] in order."""
    for mask in range(1 << max(n - 1, 0)):
        cuts, start = [], 0
        for i in range(n - 1):
            if mask >> i & 1:
                cuts.append((start, i))
                start = i + 1
        cuts.append((start, n - 1))
        yield cuts


def best_segmentation(
    d: Deployment,
    app: str,
    requests: Sequence[Request],
    now_ms: float,
    bound: int | None = None,
    waiting: int = 0,
) -> tuple[float, list[Action]]:
    """Minimum over all segmentations of the furthest-first order (ties: earlier arrival, then
    id) whose segments hold at most `bound` requests, of: total completion time from `now_ms`
    plus `waiting` times the schedule's length (requests of later apps wait that long).
    Segments run furthest first, each as one `segments.walk`; every candidate is replayed with
    `my_replay`."""
    order = furthest_first(requests)
    best: tuple[float, list[Action]] = (math.inf, [])
    for cuts in segmentations(len(order)):
        if bound is not None and any(i - j + 1 > bound for j, i in cuts):
            continue
        actions: list[Action] = []
        feasible = True
        for j, i in cuts:
            members = sorted((r.position, r.id) for r in order[j : i + 1])
            w = walk(d, app, members, build=True)
            if math.isinf(w.duration_ms):
                feasible = False
                break
            actions.extend(w.actions)
        if not feasible:
            continue
        rep = my_replay(d, requests, now_ms, actions)
        assert len(rep.completion) == len(requests)
        end = rep.spans[-1][1] if rep.spans else now_ms
        cost = total_ms(rep.completion, now_ms) + waiting * (end - now_ms)
        if cost < best[0]:
            best = (cost, actions)
    return best


def best_any_schedule(d: Deployment, model: str, positions: Sequence[int]) -> float:
    """Minimum total completion time over ALL schedules of requests at `positions` of one
    single-model app: Dijkstra over multisets of positions; a move runs stage k for any c of the
    requests standing at k (1 <= c <= B) and costs latency(k, c) times the unfinished count."""
    n_stages = d.profiles[model].num_stages
    bound = d.batch_limit(model)
    start = tuple(sorted(positions))
    dist = {start: 0.0}
    heap = [(0.0, start)]
    while heap:
        cost, s = heapq.heappop(heap)
        if not s:
            return cost
        if cost > dist[s]:
            continue
        for k, group in itertools.groupby(s):
            count = len(list(group))
            for c in range(1, min(count, bound) + 1):
                lst = list(s)
                for _ in range(c):
                    lst.remove(k)
                if k + 1 < n_stages:
                    lst.extend([k + 1] * c)
                nxt = tuple(sorted(lst))
                nc = cost + d.latency_ms(model, k, c) * len(s)
                if nc < dist.get(nxt, math.inf) - 1e-12:
                    dist[nxt] = nc
                    heapq.heappush(heap, (nc, nxt))
    raise AssertionError("no schedule finishes every request")

"""Cloud cost-planner workloads (issue 7): hardware prices, module profiles, application DAGs.

A workload document is JSON of the form

    {"hardware": {"P100": {"price": 1.0}},
     "modules": {"M1": {"profile": [{"hardware": "P100", "batch": 2, "concurrency": 1,
                                     "duration_s": 0.16}, ...]}},
     "apps": {"traffic": {"edges": [["M1", "M2"]], "rate_rps": {"M1": 100, "M2": 60},
                          "slo_s": 0.9}}}

An app's modules are the ends of its edges plus the keys of its `rate_rps` (a module with no
edges is a one-module app). `parse_workload` either returns a fully validated, immutable
`Workload` or raises `InputError` with one sentence naming the field and what was expected.

Every number is bounded (the constants below; durations and SLOs at most an hour,
`validate.MAX_LATENCY_MS`), so that a plan's machine counts, costs and worst cases stay finite
and exact enough to compare, and its searches short: out of these bounds a tiny duration or rate
divided to inf and a huge batch overflowed float (tracebacks), a huge price or SLO kept `plan`
searching for over 20 s on a two-module app.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.errors import InputError
from scheduler.profile import MAX_BATCH
from scheduler.validate import (
    is_int,
    is_number,
    json_object,
    known_keys,
    latency_at_most_an_hour,
    nonempty_str,
    number_from,
)

# Concurrent batches on one machine: MPS serves at most 48 clients per GPU (Volta and later), so
# 1024 leaves room for a machine of many GPUs; with MAX_BATCH and MIN_DURATION_S it keeps a
# machine's throughput b x s / d below 5e15 req/s.
MAX_CONCURRENCY = 1024
# A microsecond: no batch of a DNN module runs faster (a kernel launch alone takes several);
# a denormal such as 5e-324 s made b x s / d infinite.
MIN_DURATION_S = 1e-6
# Request rates of one module, per second. 1e9 is about a thousand times the busiest inference
# service's total: no real workload reaches it, and with durations of at most an hour a module
# then needs at most 3.6e12 machines, a count a float holds exactly (below 2**53), so costs stay
# finite and comparable. 1e-6 is one request in about twelve days; a batch's fill time b / rate
# then stays finite (5e-324 divided to inf).
MIN_RATE_RPS = 1e-6
MAX_RATE_RPS = 1e9
# Prices per machine-hour, in any currency (the planner only compares costs): 1e-9 to 1e9 spans
# cents per millisecond to any machine there is; throughput / price and machines x price stay
# finite (with prices of 1e300 `plan` searched for over 20 s, with 1e-300 the cost was 0).
MIN_PRICE = 1e-9
MAX_PRICE = 1e9


@dataclass(frozen=True)
class Config:
    """One profiled module configuration: `batch` requests per batch on one `hardware` machine
    running `concurrency` batches side by side (spatial multiplexing), each batch taking
    `duration_s`. Guaranteed by `parse_workload`: 1 <= batch <= MAX_BATCH,
    1 <= concurrency <= MAX_CONCURRENCY, MIN_DURATION_S <= duration_s <= 3600 (an hour),
    MIN_PRICE <= price <= MAX_PRICE (per machine)."""

    hardware: str
    batch: int
    concurrency: int
    duration_s: float
    price: float
    # Derived once (the planners read them in their inner loops):
    # requests per second one fully loaded machine completes, batch x concurrency / d;
    throughput_rps: float = field(init=False, repr=False, compare=False)
    # the throughput-cost ratio r = t / p that TC dispatch ranks machines by.
    throughput_per_price: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        throughput_rps = self.batch * self.concurrency / self.duration_s
        object.__setattr__(self, "throughput_rps", throughput_rps)
        object.__setattr__(self, "throughput_per_price", throughput_rps / self.price)


@dataclass(frozen=True)
class App:
    """One application: a DAG over `modules` (topologically ordered), its per-module request
    rates and its end-to-end latency objective. Guaranteed acyclic, every rate in
    [MIN_RATE_RPS, MAX_RATE_RPS], 0 < slo_s <= 3600 (an hour)."""

    name: str
    modules: tuple[str, ...]
    edges: tuple[tuple[str, str], ...]
    rate_rps: Mapping[str, float]
    slo_s: float


@dataclass(frozen=True)
class Workload:
    """A validated workload: `profiles[m]` is never empty, each app's modules all have one.
    `source` names it in errors found later, when it is planned (its file, as a rule)."""

    prices: Mapping[str, float]
    profiles: Mapping[str, tuple[Config, ...]]
    apps: tuple[App, ...]
    source: str = "workload"


def parse_workload(doc: object, source: str = "workload") -> Workload:
    """Validate a decoded workload JSON document; raise `InputError` on the first problem.

    Refused: a key the format does not name (the nearest one is suggested), unknown hardware in a profile row, a price, batch, concurrency, duration, rate or
    SLO out of its bounds (the constants above; a duration or SLO above an hour,
    `validate.MAX_LATENCY_MS`), a module an app uses without a profile, a module used by two
    apps (not supported yet), a cycle in an app's DAG (the cycle is named)."""
    top = json_object(doc, source, "")
    known_keys(top, ("hardware", "modules", "apps"), source, "")
    prices = _parse_hardware(top.get("hardware"), source)
    raw_modules = json_object(top.get("modules"), source, "modules")
    profiles: dict[str, tuple[Config, ...]] = {}
    for name, body in raw_modules.items():
        profiles[name] = _parse_profile(body, prices, source, f"modules.{name}")
    raw_apps = json_object(top.get("apps"), source, "apps")
    if not raw_apps:
        raise InputError(source, "apps", "at least one app")
    apps: list[App] = []
    owner: dict[str, str] = {}
    for app_name, body in raw_apps.items():
        app = _parse_app(app_name, body, profiles, source)
        for module in app.modules:
            if module in owner:
                raise InputError(
                    source,
                    f"apps.{app_name}",
                    f"modules not shared between apps ({module} is also in app {owner[module]})",
                )
            owner[module] = app_name
        apps.append(app)
    return Workload(prices=prices, profiles=profiles, apps=tuple(apps), source=source)


def _parse_hardware(raw: object, source: str) -> dict[str, float]:
    hardware = json_object(raw, source, "hardware")
    if not hardware:
        raise InputError(source, "hardware", "at least one hardware type with a price")
    prices: dict[str, float] = {}
    for name, body in hardware.items():
        entry = json_object(body, source, f"hardware.{name}")
        known_keys(entry, ("price",), source, f"hardware.{name}")
        prices[name] = number_from(
            entry.get("price"), MIN_PRICE, MAX_PRICE, "a price per machine-hour", source,
            f"hardware.{name}.price",
        )  # fmt: skip
    return prices


def _parse_profile(
    body: object, prices: Mapping[str, float], source: str, field: str
) -> tuple[Config, ...]:
    module = json_object(body, source, field)
    known_keys(module, ("profile",), source, field)
    rows = module.get("profile")
    if not isinstance(rows, list) or not rows:
        raise InputError(source, f"{field}.profile", "a non-empty list of profile rows", rows)
    configs: list[Config] = []
    for i, row_raw in enumerate(rows):
        where = f"{field}.profile[{i}]"
        row = json_object(row_raw, source, where)
        known_keys(row, ("hardware", "batch", "concurrency", "duration_s"), source, where)
        hardware = nonempty_str(row.get("hardware"), source, f"{where}.hardware")
        if hardware not in prices:
            known = ", ".join(sorted(prices))
            raise InputError(
                source, f"{where}.hardware", f"one of the hardware types ({known})", hardware
            )
        batch = row.get("batch")
        concurrency = row.get("concurrency", 1)
        duration_s = row.get("duration_s")
        if not is_int(batch) or not 1 <= batch <= MAX_BATCH:
            raise InputError(source, f"{where}.batch", f"an integer from 1 to {MAX_BATCH}", batch)
        if not is_int(concurrency) or not 1 <= concurrency <= MAX_CONCURRENCY:
            raise InputError(
                source,
                f"{where}.concurrency",
                f"an integer from 1 to {MAX_CONCURRENCY}",
                concurrency,
            )
        if not is_number(duration_s) or not duration_s >= MIN_DURATION_S:
            raise InputError(
                source,
                f"{where}.duration_s",
                f"a duration of at least {MIN_DURATION_S:g} s (a microsecond)",
                duration_s,
            )
        latency_at_most_an_hour(duration_s, "s", source, f"{where}.duration_s")
        configs.append(Config(hardware, batch, concurrency, float(duration_s), prices[hardware]))
    return tuple(configs)


def _parse_app(
    name: str, body: object, profiles: Mapping[str, tuple[Config, ...]], source: str
) -> App:
    field = f"apps.{name}"
    app = json_object(body, source, field)
    known_keys(app, ("edges", "rate_rps", "slo_s"), source, field)
    raw_edges = app.get("edges", [])
    if not isinstance(raw_edges, list):
        raise InputError(source, f"{field}.edges", "a list of [from, to] module pairs", raw_edges)
    edges: list[tuple[str, str]] = []
    for i, edge in enumerate(raw_edges):
        if (
            not isinstance(edge, list)
            or len(edge) != 2
            or not all(isinstance(m, str) and m for m in edge)
        ):
            raise InputError(
                source, f"{field}.edges[{i}]", "a [from, to] pair of module names", edge
            )
        edges.append((edge[0], edge[1]))
    rates_raw = json_object(app.get("rate_rps"), source, f"{field}.rate_rps")
    modules: list[str] = []
    for m in [*(m for e in edges for m in e), *rates_raw]:
        if m not in modules:
            modules.append(m)
    if not modules:
        raise InputError(source, field, "at least one module (in edges or rate_rps)")
    for m in modules:
        if m not in profiles:
            raise InputError(source, f"{field}", f"a profile under modules.{m} for module {m}")
    rates: dict[str, float] = {}
    for m in modules:
        rates[m] = number_from(
            rates_raw.get(m), MIN_RATE_RPS, MAX_RATE_RPS, "a request rate per second", source,
            f"{field}.rate_rps.{m}",
        )  # fmt: skip
    slo = app.get("slo_s")
    if not is_number(slo) or not (math.isfinite(slo) and slo > 0):
        raise InputError(
            source, f"{field}.slo_s", "a positive finite latency objective in seconds", slo
        )
    latency_at_most_an_hour(slo, "s", source, f"{field}.slo_s")  # longer is no serving SLO
    order = _topological_order(modules, edges, source, field)
    return App(name, order, tuple(edges), rates, float(slo))


def _topological_order(
    modules: list[str], edges: list[tuple[str, str]], source: str, field: str
) -> tuple[str, ...]:
    """Modules in topological order (stable in first-mention order); a cycle raises InputError
    naming it as `A -> B -> A`."""
    children: dict[str, list[str]] = {m: [] for m in modules}
    for a, b in edges:
        if b not in children[a]:
            children[a].append(b)
    state: dict[str, int] = dict.fromkeys(modules, 0)  # 0 new, 1 on stack, 2 done
    post: list[str] = []
    for root in modules:
        if state[root]:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = [root]
        state[root] = 1
        while stack:
            node, i = stack[-1]
            if i < len(children[node]):
                stack[-1] = (node, i + 1)
                child = children[node][i]
                if state[child] == 1:
                    cycle = [*path[path.index(child) :], child]
                    raise InputError(
                        source, f"{field}.edges", "an acyclic graph", _Cycle(" -> ".join(cycle))
                    )
                if state[child] == 0:
                    state[child] = 1
                    stack.append((child, 0))
                    path.append(child)
            else:
                stack.pop()
                path.pop()
                state[node] = 2
                post.append(node)
    return tuple(reversed(post))


class _Cycle(str):
    """A cycle rendered without quotes in the error message."""

    def __repr__(self) -> str:
        return f"the cycle {self!s}"


def module_parents(app: App) -> dict[str, list[str]]:
    """Each module's direct predecessors in `app`'s DAG."""
    parents: dict[str, list[str]] = {m: [] for m in app.modules}
    for a, b in app.edges:
        if a not in parents[b]:
            parents[b].append(a)
    return parents

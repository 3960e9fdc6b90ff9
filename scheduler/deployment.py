"""What the scheduler plans over: models (profiles), apps (chains of models), batch bounds, groups.

Apps that list the same model share its stages: a request of app `pose = [detector, head]` that
stands at stage 3 of `detector` can batch with a request of app `detector` at its stage 3.
Positions count over an app's whole chain; `locate` maps one to (model, stage).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.errors import InputError
from scheduler.profile import Profile, balanced_bounds
from scheduler.types import App

DEFAULT_GROUPS = 5
# The server's floor on a layer group's batch-1 time (`groups_by_duration`): each group ends a
# step, and on a 2-core CPU the device waits about 1 ms for the next one to be handed out, so a
# group should be several times that long.
DEFAULT_MIN_GROUP_MS = 4.0


@dataclass(frozen=True)
class ChainLink:
    """Model `model` occupies positions [offset, offset + num_stages) of an app's chain."""

    model: str
    offset: int
    num_stages: int

    @property
    def end(self) -> int:
        return self.offset + self.num_stages


class Deployment:
    """Profiles, apps and the bounds that every policy plans with. Immutable after construction.

    `max_batch` caps every model's batch bound B (a model's bound is the smaller of this cap and
    its profile's `max_batch`). `groups` is G, the number of layer groups per model of about equal
    batch-1 time (paper section 4.1): the runtime re-plans after each group, and the grouped DP
    treats the requests inside one group as one unit. It is one G for every model, or a G per
    model (every model named, e.g. from `groups_by_duration`).
    """

    def __init__(
        self,
        profiles: Iterable[Profile],
        apps: Iterable[App] | None = None,
        max_batch: int | None = None,
        groups: int | Mapping[str, int] = DEFAULT_GROUPS,
        source: str = "deployment",
    ) -> None:
        self.profiles: dict[str, Profile] = {}
        for p in profiles:
            if p.model in self.profiles:
                raise InputError(source, "profiles", f"one profile per model ({p.model} twice)")
            self.profiles[p.model] = p
        if not self.profiles:
            raise InputError(source, "profiles", "at least one profile")
        if max_batch is not None and max_batch < 1:
            raise InputError(source, "max_batch", "a positive integer", max_batch)
        per_model = {m: groups for m in self.profiles} if isinstance(groups, int) else dict(groups)
        if set(per_model) != set(self.profiles):
            raise InputError(
                source, "groups", f"a number of layer groups for each of {sorted(self.profiles)}",
                sorted(per_model),
            )  # fmt: skip
        for m, g in per_model.items():
            if not isinstance(g, int) or g < 1:
                raise InputError(source, f"groups.{m}", "a positive number of layer groups", g)
        app_list = list(apps) if apps is not None else []
        if not app_list:
            app_list = [App(m, (m,)) for m in self.profiles]
        self.apps: dict[str, App] = {}
        for app in app_list:
            _check_app(app, self.profiles, source)
            self.apps[app.name] = app
        self.max_batch_cap = max_batch
        self.groups = groups
        self._chains = {a.name: _chain(a, self.profiles) for a in app_list}
        self._stage_at = {
            a: tuple((link.model, k) for link in chain for k in range(link.num_stages))
            for a, chain in self._chains.items()
        }
        self._limits = {
            m: p.max_batch if max_batch is None else min(p.max_batch, max_batch)
            for m, p in self.profiles.items()
        }
        self._tables = {m: p.table(self._limits[m]) for m, p in self.profiles.items()}
        self._bounds = {m: _group_bounds(p, per_model[m]) for m, p in self.profiles.items()}
        # per app, for every position: the layer group it lies in, counted over the chain
        self._group_at = {a: self._chain_groups(chain) for a, chain in self._chains.items()}
        # memos of the pure functions of the above that planners call most (run_ms, solo_ms)
        self._run_memo: dict[tuple[str, int, int, int], float] = {}
        self._tail_memo: dict[tuple[str, int], float] = {}
        self._solo_memo: dict[tuple[str, int], float] = {}

    def with_profiles(self, profiles: Iterable[Profile]) -> Deployment:
        """The same apps, batch cap and layer groups on `profiles` (one per model, e.g. this
        deployment's rescaled or with an entry cost)."""
        return Deployment(profiles, list(self.apps.values()), self.max_batch_cap, self.groups)

    # --- chains -------------------------------------------------------------------------
    def chain(self, app: str) -> tuple[ChainLink, ...]:
        return self._chains[app]

    def app_length(self, app: str) -> int:
        """Total number of stages of `app`; a request at this position is finished."""
        return self._chains[app][-1].end

    def locate(self, app: str, position: int) -> tuple[str, int]:
        """(model, stage) at which a request of `app` at `position` stands (position < length)."""
        return self._stage_at[app][position]

    def link_of(self, app: str, model: str) -> ChainLink | None:
        for link in self._chains[app]:
            if link.model == model:
                return link
        return None

    def apps_sharing(self, app: str) -> frozenset[str]:
        """Other apps that list at least one model of `app`."""
        mine = set(self.apps[app].models)
        return frozenset(a for a, spec in self.apps.items() if a != app and mine & set(spec.models))

    # --- latency ------------------------------------------------------------------------
    def batch_limit(self, model: str) -> int:
        """B for `model`: the largest batch any stage of it may run."""
        return self._limits[model]

    def table(self, model: str) -> tuple[tuple[float, ...], ...]:
        """`table[k][b]` = latency of stage k at batch b, for 0 <= b <= batch_limit(model)."""
        return self._tables[model]

    def latency_ms(self, model: str, stage: int, batch: int) -> float:
        if batch > self._limits[model]:
            return math.inf
        return self._tables[model][stage][batch]

    def run_ms(self, model: str, k0: int, k1: int, batch: int) -> float:
        """Latency of stages [k0, k1) of `model` at one batch size (the stages' latencies summed
        in order; remembered, as planners ask for the same spans over and over)."""
        key = (model, k0, k1, batch)
        hit = self._run_memo.get(key)
        if hit is None:
            if batch > self._limits[model]:
                hit = math.inf
            else:
                t = self._tables[model]
                hit = sum(t[k][batch] for k in range(k0, k1))
            self._run_memo[key] = hit
        return hit

    def solo_ms(self, app: str, position: int) -> float:
        """Time for one request of `app` to run alone from `position` to the end of its app."""
        key = (app, position)
        hit = self._solo_memo.get(key)
        if hit is None:
            hit = self._solo_memo[key] = sum(
                self.run_ms(link.model, max(0, position - link.offset), link.num_stages, 1)
                for link in self._chains[app]
                if position < link.end
            )
        return hit

    def tail_ms(self, app: str, position: int) -> float:
        """What one more request of `app` from `position` adds to a long queue: the time a
        sample takes from there to the end of its app at each model's cheapest batch size per
        sample (what a saturated server spends on each request it takes)."""
        key = (app, position)
        hit = self._tail_memo.get(key)
        if hit is None:
            hit = self._tail_memo[key] = sum(
                min(
                    self.run_ms(link.model, max(0, position - link.offset), link.num_stages, b) / b
                    for b in range(1, self._limits[link.model] + 1)
                )
                for link in self._chains[app]
                if position < link.end
            )
        return hit

    # --- groups -------------------------------------------------------------------------
    def group_bounds(self, model: str) -> tuple[int, ...]:
        """Stage indices where the groups of `model` start, first 0, increasing."""
        return self._bounds[model]

    def group_end(self, model: str, stage: int) -> int:
        """First group boundary strictly after `stage` (the model's stage count at the end)."""
        for b in self._bounds[model]:
            if b > stage:
                return b
        return self.profiles[model].num_stages

    def chain_groups(self, app: str) -> tuple[int, ...]:
        """For every position of `app`, the index of the layer group it lies in, counted over
        the app's whole chain."""
        return self._group_at[app]

    def group_of(self, model: str, stage: int) -> int:
        """Index of the layer group of `model` that `stage` lies in."""
        return sum(1 for b in self._bounds[model] if b <= stage) - 1

    def _chain_groups(self, chain: tuple[ChainLink, ...]) -> tuple[int, ...]:
        out: list[int] = []
        base = 0
        for link in chain:
            out.extend(base + self.group_of(link.model, k) for k in range(link.num_stages))
            base += len(self._bounds[link.model])
        return tuple(out)


def _check_app(app: App, profiles: Mapping[str, Profile], source: str) -> None:
    if not app.models:
        raise InputError(source, f"apps.{app.name}", "a non-empty list of model names")
    for m in app.models:
        if m not in profiles:
            raise InputError(
                source,
                f"apps.{app.name}",
                f"models with a profile ({', '.join(sorted(profiles))})",
                m,
            )
    if len(set(app.models)) != len(app.models):
        raise InputError(
            source, f"apps.{app.name}", "each model at most once in a chain", list(app.models)
        )


def _chain(app: App, profiles: Mapping[str, Profile]) -> tuple[ChainLink, ...]:
    links = []
    offset = 0
    for m in app.models:
        n = profiles[m].num_stages
        links.append(ChainLink(m, offset, n))
        offset += n
    return tuple(links)


def groups_by_duration(
    profiles: Iterable[Profile], groups: int, min_group_ms: float
) -> dict[str, int]:
    """A G per model: `groups`, or fewer where the model is short, so that its groups take at
    least `min_group_ms` each at batch 1 (at least one group): min(G, max(1, floor(T / min)))
    with T the model's batch-1 time. `min_group_ms` 0 gives every model `groups`.

    Why: each group ends a step, and the device waits for the next one to be handed out. On a
    2-core CPU that hand-off took about 1 ms, and resnet20_cifar10 (1.9 ms a sample) or UltraFace
    (6.7 ms) cut in 5 groups spent as long waiting as computing. In the simulator with 1 ms a
    step, the demo's five models at 300 ms: dp-tardy's capacity 80 req/s with 5 groups each, 95
    with a 3-5 ms floor; mobilenet_v2 alone 175 -> 185 req/s; resnet18 and googlenet (23 ms)
    keep their 5 groups (bench/results/peers-log.md, session 36)."""
    if min_group_ms < 0 or not math.isfinite(min_group_ms):
        raise InputError("deployment", "min_group_ms", "a finite number of ms >= 0", min_group_ms)
    out = {}
    for p in profiles:
        fit = groups if min_group_ms == 0 else max(1, math.floor(sum(p.batch1_ms) / min_group_ms))
        out[p.model] = min(groups, fit)
    return out


def _group_bounds(profile: Profile, groups: int) -> tuple[int, ...]:
    """Start stages of `groups` contiguous groups of about equal batch-1 latency."""
    return balanced_bounds(profile.batch1_ms, groups)

"""Several apps: one DP per app, then the best order of apps (paper 003, section 4.3).

An order runs every request of the first app to completion (picking up riders of other apps at
shared models), then the second app, and so on; re-planning after every layer group lets the
runtime interleave apps over time. For dp-time an app's DP is weighted by the requests of the
apps after it (they all wait), so the sum of the apps' DP costs is the total completion time of
the order. For dp-tardy the apps run from the end time of the previous ones and the order is
compared by (tardy requests, total completion time).

Up to EXACT_APPS active apps every order is searched (depth-first, with branch-and-bound on the
partial objective, and memoised per-app solutions for apps whose requests earlier apps cannot
move). Above that the order is Smith's rule for dp-time (ascending schedule duration / number
of requests, the optimal order for independent apps run as single blocks) and earliest
deadline first over apps for dp-tardy.

EXACT_APPS is 3: with more apps the search costs more than it gains. Under re-planning only a
plan's first steps run, and the exact order of a snapshot did not serve more on time than the
heuristic order (simulated, Poisson arrivals, dp-tardy, 2-3 seeds of 3000 requests; on time with
the search up to 6 apps -> up to 3, and the mean time a plan took):
- the five demo apps on the shipped CPU profiles, 300 ms: 0.966 -> 0.976 at 100 req/s, 0.897 ->
  0.915 at 120; 677 -> 270 us and 1248 -> 458 us;
- four of them (no resnet20_cifar10): 0.975 -> 0.979 at 80 req/s, 0.885 -> 0.887 at 100;
  343 -> 236 us and 799 -> 489 us;
- the five V100 profiles, 150 ms: 0.980 -> 0.980 at 60 req/s, 0.914 -> 0.921 at 80, 0.828 ->
  0.837 at 100; 198 -> 135, 520 -> 277 and 859 -> 415 us.
(bench/results/peers-log.md, session 82.)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.deployment import Deployment
from scheduler.dp import (
    AppProblem,
    SegmentCosts,
    Solution,
    UnitMode,
    make_problem,
    solve_tardy,
    solve_time,
)
from scheduler.segments import Rider, walk
from scheduler.types import Action, Request

EXACT_APPS = 3

Prefix = tuple[tuple[str, tuple[tuple[int, int], ...]], ...]


@dataclass(frozen=True)
class Positions:
    """Where each unfinished request stands during the search, and how many each app has left."""

    pos: dict[str, int]
    left: dict[str, int]

    def copy(self) -> Positions:
        return Positions(dict(self.pos), dict(self.left))


@dataclass(frozen=True)
class Ordered:
    """The chosen order of apps: each app's problem (as the order leaves it) and segmentation,
    and the objective of the whole."""

    steps: tuple[tuple[AppProblem, Solution], ...]
    cost_ms: float
    tardy: int

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(prob.app for prob, _ in self.steps)


class AppSearch:
    """Plans the given requests (all unfinished) app by app; see the module docstring."""

    def __init__(
        self,
        d: Deployment,
        requests: Sequence[Request],
        mode: UnitMode,
        memo: dict[str, dict[Any, Any]],
        now_ms: float,
        cut_after: frozenset[str] = frozenset(),
    ) -> None:
        self.d = d
        self.mode = mode
        self.cut_after = cut_after
        self.now_ms = now_ms
        self.memo_d = memo.setdefault("segment_ms", {})
        self.memo_g = memo.setdefault("suffix_cost", {})
        self.req = {r.id: r for r in requests}
        self.by_app: dict[str, list[Request]] = defaultdict(list)
        for r in sorted(requests, key=lambda r: (r.arrival_ms, r.id)):  # make_problem needs it
            self.by_app[r.app].append(r)
        self.apps = tuple(sorted(self.by_app))
        self.sharing = {a: d.apps_sharing(a) & set(self.apps) for a in self.apps}
        self.component = _components(self.apps, self.sharing)
        # keyed by the app and the `_prefix` before it
        self._problems: dict[tuple[str, Prefix], AppProblem] = {}
        self._solved: dict[tuple[Any, ...], tuple[AppProblem, Solution]] = {}

    def start(self) -> Positions:
        return Positions(
            {r.id: r.position for r in self.req.values()},
            {a: len(rs) for a, rs in self.by_app.items()},
        )

    # --- one app ----------------------------------------------------------------------
    def problem(self, app: str, at: Positions) -> AppProblem:
        own = [(r, at.pos[r.id]) for r in self.by_app[app] if r.id in at.pos]
        riders: list[Rider] = []
        for other in sorted(self.sharing[app]):
            for r in self.by_app[other]:
                p = at.pos.get(r.id)
                if p is None:
                    continue
                model, stage = self.d.locate(other, p)
                mine = self.d.link_of(app, model)
                theirs = self.d.link_of(other, model)
                if mine is not None and theirs is not None:
                    riders.append(Rider(r.id, mine.offset + stage, mine.end, theirs.end))
        return make_problem(self.d, app, own, riders, self.mode, self.cut_after)

    def costs(self, prob: AppProblem) -> SegmentCosts:
        return SegmentCosts(self.d, prob, self.memo_d)

    def run(
        self, prob: AppProblem, sol: Solution, at: Positions, build: bool
    ) -> tuple[Positions, list[Action]]:
        """Apply the app's segments: its requests finish, riders advance to their next model.

        Returns new positions; `at` is left as it was (the search backtracks through it). An app
        that shares no model with another active app moves nobody else, so its positions are
        shared with `at` and only its count of requests left changes.
        """
        costs = self.costs(prob)
        shares = bool(self.sharing[prob.app])
        out = at.copy() if shares else Positions(at.pos, dict(at.left))
        actions: list[Action] = []
        for j, i in sol.cuts:
            if shares:
                for u in range(j, i + 1):
                    for _, rid in prob.units[u].members:
                        out.pos.pop(rid, None)
            riders = costs.riders_for(j, i)
            if not build and not riders:
                continue
            w = walk(self.d, prob.app, costs.members(j, i), riders, build=True)
            actions.extend(w.actions)
            for rider in w.riders:
                owner = self.req[rider.id].app
                if rider.next_pos >= self.d.app_length(owner):
                    out.pos.pop(rider.id, None)
                    out.left[owner] -= 1
                else:
                    out.pos[rider.id] = rider.next_pos
        out.left[prob.app] = 0
        return out, actions

    # --- orders of apps ---------------------------------------------------------------
    def best_order(self, objective: str) -> Ordered:
        if len(self.apps) > EXACT_APPS:
            return self._heuristic(objective)
        # the heuristic order first: a good incumbent prunes most of the search
        best: list[Any] = [self._heuristic(objective)] if len(self.apps) > 2 else [None]
        self._dfs(objective, self.apps, self.start(), (), 0.0, 0, self.now_ms, best)
        found: Ordered = best[0]
        return found

    def _solve(
        self,
        objective: str,
        app: str,
        at: Positions,
        rest: Sequence[str],
        t0: float,
        steps: Sequence[tuple[AppProblem, Solution]],
    ) -> tuple[AppProblem, Solution]:
        # the app's problem depends only on the apps before it that can move its requests and on
        # the segmentations they ran (see `_prefix`)
        prefix = _prefix(steps, self.component[app])
        prob = self._problems.get((app, prefix))
        if prob is None:
            prob = self._problems[(app, prefix)] = self.problem(app, at)
        if objective == "time":
            waiting = sum(at.left[b] for b in rest)
            key: tuple[Any, ...] = (app, prefix, waiting)
        else:
            key = (app, prefix, t0)
        hit = self._solved.get(key)
        if hit is None:
            costs = self.costs(prob)
            sol = (
                solve_time(costs, waiting, self.memo_g)
                if objective == "time"
                else solve_tardy(costs, t0, self.now_ms)
            )
            hit = self._solved[key] = (prob, sol)
        return hit

    def _dfs(
        self,
        objective: str,
        remaining: tuple[str, ...],
        at: Positions,
        steps: tuple[tuple[AppProblem, Solution], ...],
        cost: float,
        tardy: int,
        t0: float,
        best: list[Any],
    ) -> None:
        live = tuple(a for a in remaining if at.left[a] > 0)
        if not live:
            cand = Ordered(steps, cost, tardy)
            if best[0] is None or (tardy, cost) < (best[0].tardy, best[0].cost_ms):
                best[0] = cand
            return
        for a in live:
            rest = tuple(b for b in live if b != a)
            prob, sol = self._solve(objective, a, at, rest, t0, steps)
            # time: sol.cost_ms charges the apps after `a` for waiting; tardy: it is the sum of
            # a's completion times measured from now. Either way the costs add up.
            c2, t2 = cost + sol.cost_ms, tardy + sol.tardy
            if best[0] is not None and (t2, c2) >= (best[0].tardy, best[0].cost_ms):
                continue
            nxt, _ = self.run(prob, sol, at, build=False)
            self._dfs(
                objective,
                rest,
                nxt,
                steps + ((prob, sol),),
                c2,
                t2,
                t0 + sol.duration_ms,
                best,
            )

    def _heuristic(self, objective: str) -> Ordered:
        at = self.start()
        steps: list[tuple[AppProblem, Solution]] = []
        cost, tardy, t0 = 0.0, 0, self.now_ms
        remaining = list(self.apps)
        while True:
            live = [a for a in remaining if at.left[a] > 0]
            if not live:
                break
            if objective == "time":
                scored = []
                for a in live:
                    rest = [b for b in live if b != a]
                    prob, sol = self._solve(objective, a, at, rest, t0, steps)
                    scored.append((sol.duration_ms / at.left[a], a, prob, sol))
                _, a, prob, sol = min(scored, key=lambda x: (x[0], x[1]))
            else:
                a = min(live, key=lambda x: (min(r.deadline_ms for r in self.by_app[x]), x))
                rest = [b for b in live if b != a]
                prob, sol = self._solve(objective, a, at, rest, t0, steps)
                tardy += sol.tardy
            at, _ = self.run(prob, sol, at, build=False)
            cost += sol.cost_ms
            t0 += sol.duration_ms
            steps.append((prob, sol))
            remaining.remove(a)
        return Ordered(tuple(steps), cost, tardy)

    def interleaved_tardy(self) -> list[Action]:
        """Each app's tardy segmentation as if it ran first (no riders), the apps' segments then
        merged by earliest deadline, each app's segments kept in their order."""
        queues: list[list[tuple[float, list[Action]]]] = []
        at = self.start()
        for app in self.apps:
            own = [(r, at.pos[r.id]) for r in self.by_app[app]]
            prob = make_problem(self.d, app, own, [], self.mode, self.cut_after)
            costs = self.costs(prob)
            sol = solve_tardy(costs, self.now_ms, self.now_ms)
            segs = []
            for j, i in sol.cuts:
                first_deadline = min(prob.units[u].deadlines[0] for u in range(j, i + 1))
                segs.append(
                    (first_deadline, walk(self.d, app, costs.members(j, i), build=True).actions)
                )
            queues.append(segs)
        out: list[Action] = []
        heads = [0] * len(queues)
        while True:
            ready = [(q[heads[n]][0], n) for n, q in enumerate(queues) if heads[n] < len(q)]
            if not ready:
                return out
            _, n = min(ready)
            out.extend(queues[n][heads[n]][1])
            heads[n] += 1

    def actions(self, ordered: Ordered) -> list[Action]:
        """The chosen order's actions, from the initial positions."""
        at = self.start()
        out: list[Action] = []
        for prob, sol in ordered.steps:
            at, acts = self.run(prob, sol, at, build=True)
            out.extend(acts)
        return out


def _prefix(steps: Sequence[tuple[AppProblem, Solution]], component: frozenset[str]) -> Prefix:
    """What fixes where an app's requests stand: the apps before it in its component (the only
    ones that can move them), in order, each with the segmentation it ran. The names alone are
    not enough: an app's segmentation also depends on apps of other components (how many wait
    after it for dp-time, when it starts for dp-tardy), and a different segmentation carries
    different riders along."""
    return tuple((p.app, s.cuts) for p, s in steps if p.app in component)


def _components(
    apps: Sequence[str], sharing: dict[str, frozenset[str]]
) -> dict[str, frozenset[str]]:
    comp: dict[str, frozenset[str]] = {}
    for a in apps:
        if a in comp:
            continue
        seen = {a}
        stack = [a]
        while stack:
            x = stack.pop()
            for y in sharing[x]:
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        group = frozenset(seen)
        for x in group:
            comp[x] = group
    return comp

"""`dp-time` and `dp-tardy`: the paper's dynamic programs (paper 003, sections 4.1-4.3).

dp-time minimises the total completion time of the active requests (objective: that total in ms,
measured from now).

dp-tardy minimises the number of requests that miss their deadline (objective: that number, drops
included). It drops the requests that cannot make their deadline even alone, then repeats: plan the
survivors several ways and keep the plan with the fewest late requests (then the smallest total
completion time); if it has late requests, drop them and go again. The completion-time DP's plan
and `dynamic`'s (oldest first, each batch run to its model's end) come first: when the
completion-time plan leaves nobody late it is the answer, unless `dynamic`'s leaves nobody late
either and the tightest request more slack (its deadline less its completion); only otherwise are
the others made. Least total completion alone runs the shortest jobs first: with several apps, the
light models' requests as they come, in small batches, while the heavy models' wait until the plans
find them late and drop them. The five demo apps at 300 ms under Poisson arrivals, one runtime of
one thread on 2 cores, 100 req/s: 0.84-0.90 on time (three runs) became 0.93-0.96, against
`dynamic`'s 0.985-1.00 there; in the simulator on the shipped CPU profiles (three seeds at 80 / 100
/ 120 req/s) 0.980 / 0.916 / 0.854 became 0.998 / 0.966 / 0.897, with `dynamic` at 0.997 / 0.948 /
0.787. With one app the rule changed none of bench/peers_sim.py's 48 runs
(bench/results/peers-log.md, session 82). The candidate plans are the completion-time DP,
`dynamic`'s, the tardy-count DP over orders of apps, with several apps the apps' tardy
segmentations merged by earliest deadline (an order-of-apps plan runs one app to completion first,
which can leave late a request that re-planning would serve on time), and the previous round's plan
without the requests dropped since (their batch slots freed, the others only get earlier; in the
first round, the completion-time plan and `dynamic`'s made with the hopeless requests). Each round
keeps the fewest late, but the rounds re-form batches as they drop, and over several rounds that
can drop more than `dynamic`'s plan leaves late (hypothesis found 10 requests of four apps over
three shared models: 2 dropped against 1 late; tests/test_policies.py keeps the case); then
`dynamic`'s plan, its late requests dropped, is the answer. So with latencies that grow with batch
size, dp-tardy never misses more requests than `dynamic` would.

A unit holds a layer group's waiting requests (up to B), so a plan runs them together or not at
all: in an Azure-trace burst (simulated), 28 requests waiting at the first stage behind a running
batch of 22 formed one unit, a batch of 28 after the 22 would end after the oldest three's
deadline, and those three were dropped; cut after them, the plan runs the three up to the running
batch's stage (preempting it there), the 25 on together, and then the other 25: all on time. So
when every candidate above leaves someone late, in the rounds of dropping, the tardy-count DP runs
once more with each unit cut after its late requests (the oldest of a unit at one position are its
earliest due), and that plan is taken if it leaves fewer late. Not in the add-back below: there,
under Poisson overload, it would run once per drop (measured: planning 5% of the wall time instead
of 2% past the ceiling, and 5-8 points of on-time ratio lost). In the simulator with
bench/peers.py's trace arrivals at 1000 ms, B = 32 and 6 ms a request added to the first stage,
resnet18's crossing of 0.9 went from 12.4 to 13.8 req/s; under Poisson arrivals no crossing moved
more than 2% (bench/results/peers-log.md, 2026-11-24, session 32, with the versions not kept).

A round's late requests delayed the others while its plan still ran them, so a round may drop
more than it must (and the DP's units hold requests together: with layer-group units, a unit that
ends late is late whole). So once nobody is left late, each request dropped as predicted late is
added back, oldest first, if a plan with it added still leaves nobody late (measured on the
server's own states in an Azure-trace burst: 5 drops instead of 14, each re-plan 1-3 ms). Past
capacity hardly any trial finds room, and each is a re-plan: 200 mobilenet_v2 requests queued
for a 1000 ms deadline, 81 of them predicted late, took 22.6 ms to plan. So after
ADD_BACK_PATIENCE refusals in a row the rest are dropped untried (2.8 ms). In the simulator no
crossing of 0.9 moved (`bench/peers_sim.py`, resnet18 and mobilenet_v2, Poisson and trace, 300
and 1000 ms; resnet18 under the trace at 300 ms went from 8.0 to 8.1 req/s); on the server,
mobilenet_v2 at 1000 ms and 150 req/s, the loop's planning fell from 9.0% to 7.1% of the wall
time (three pairs).

Only the first `max_active` (default 500) requests in arrival order are planned by the DP (paper
section 4.1); the rest are appended in arrival order in segments of B and reconsidered as the
earlier ones finish. The recurrences are in `scheduler.dp`, the order of apps in `scheduler.search`.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import Any, Literal, NamedTuple

from scheduler.dp import UnitMode
from scheduler.policies.common import HOPELESS, PREDICTED_LATE, arrival_order, split_expired
from scheduler.policies.whole_model import whole_model_schedule
from scheduler.search import AppSearch
from scheduler.segments import walk
from scheduler.state import SchedulerState
from scheduler.timeline import finish_plan, replay, total_completion_ms
from scheduler.types import Action, Drop, Plan, Request

DEFAULT_MAX_ACTIVE = 500
ADD_BACK_PATIENCE = 3  # add-back trials in a row that find no room before the rest are dropped


class DPScheduler:
    """The DP policy; `objective` is "time" (dp-time) or "tardy" (dp-tardy)."""

    def __init__(
        self,
        objective: Literal["time", "tardy"] = "time",
        unit: UnitMode = "group",
        max_active: int = DEFAULT_MAX_ACTIVE,
    ) -> None:
        self.objective = objective
        self.unit: UnitMode = unit
        self.max_active = max_active
        self.name = "dp-time" if objective == "time" else "dp-tardy"

    def plan(self, state: SchedulerState, now_ms: float) -> Plan:
        live, drops = split_expired(state, now_ms)
        memo: dict[str, Any] = state.memo.setdefault(f"{self.name}/{self.unit}", {})
        if self.objective == "time":
            actions = self._actions(state, live, now_ms, "time", memo)
            return finish_plan(state, now_ms, actions, drops, policy=self.name)
        return self._plan_tardy(state, live, drops, now_ms, memo)

    def _actions(
        self,
        state: SchedulerState,
        live: list[Request],
        now_ms: float,
        objective: str,
        memo: dict[str, Any],
        interleave: bool = False,
        cut_after: frozenset[str] = frozenset(),
    ) -> list[Action]:
        head, tail = live[: self.max_active], live[self.max_active :]
        search = AppSearch(state.deployment, head, self.unit, memo, now_ms, cut_after)
        if not head:
            actions = []
        elif interleave:
            actions = search.interleaved_tardy()
        else:
            actions = search.actions(search.best_order(objective))
        return actions + _tail_actions(state, tail)

    def _plan_tardy(
        self,
        state: SchedulerState,
        live: list[Request],
        drops: list[Drop],
        now_ms: float,
        memo: dict[str, Any],
    ) -> Plan:
        d = state.deployment
        # late even if run alone now: dropped at once. The completion-time plan and `dynamic`'s
        # made with them, minus them, stand in for those plans of the others in the first round:
        # dropping re-forms the batches, which may serve the others worse than the old batches
        # with the hopeless requests taken out.
        alone_ms = {r.id: now_ms + d.solo_ms(r.app, r.position) for r in live}
        hopeless = {r.id for r in live if alone_ms[r.id] > r.deadline_ms}
        actions: list[Action] = []
        fifo = whole_model_schedule(d, live, now_ms, "never")
        if hopeless:
            actions = _without(self._actions(state, live, now_ms, "time", memo), hopeless)
            fifo = _without(fifo, hopeless)
            drops = drops + [Drop(rid, HOPELESS, alone_ms[rid]) for rid in sorted(hopeless)]
            live = [r for r in live if r.id not in hopeless]
        planned = {r.id for r in live[: self.max_active]}
        multi_app = len({r.app for r in live[: self.max_active]}) > 1
        served = live  # everything the rounds below may drop
        fifo_scored = _late_and_total(state, served, planned, now_ms, fifo)
        first_fifo: tuple[list[Action], _Scored] | None = (fifo, fifo_scored)  # first round's
        predicted_late: list[Request] = []
        predicted_ms: dict[str, float] = {}  # when the round that found it late would finish it
        while True:
            late, actions, completion = self._fewest_late(
                state, live, planned, now_ms, memo, multi_app, actions, fifo=first_fifo
            )
            first_fifo = None
            if not late:
                break
            gone = set(late)
            predicted_late += [r for r in live if r.id in gone]
            predicted_ms.update((rid, completion[rid]) for rid in late)
            live = [r for r in live if r.id not in gone]
            actions = _without(actions, gone)
        # a round drops every request its plan leaves late, and those, while they ran, delayed
        # the rest: add back, oldest first, each that the others leave room for, until
        # ADD_BACK_PATIENCE in a row find no room
        refused = 0
        for r in sorted(predicted_late, key=arrival_order):
            if refused < ADD_BACK_PATIENCE:
                trial = sorted([*live, r], key=arrival_order)
                late, trial_actions, trial_completion = self._fewest_late(
                    state, trial, planned, now_ms, memo, multi_app, [], cut_units=False
                )
                if not late:
                    live, actions, completion = trial, trial_actions, trial_completion
                    refused = 0
                    continue
                refused += 1
            drops = [*drops, Drop(r.id, PREDICTED_LATE, predicted_ms[r.id])]
        # never more late than `dynamic` (module docstring)
        if len(served) - len(live) > len(fifo_scored.late):
            gone = set(fifo_scored.late)
            live = [r for r in served if r.id not in gone]
            actions = _without(fifo, gone)
            completion = replay(d, live, now_ms, actions, state.running)[0]
            kept = {r.id for r in live}
            drops = [x for x in drops if x.request_id not in kept] + [
                Drop(rid, PREDICTED_LATE, fifo_scored.completion[rid]) for rid in sorted(gone)
            ]
        return finish_plan(
            state,
            now_ms,
            actions,
            drops,
            objective=float(len(drops)),
            policy=self.name,
            completion=completion,
        )

    def _fewest_late(
        self,
        state: SchedulerState,
        live: list[Request],
        planned: set[str],
        now_ms: float,
        memo: dict[str, Any],
        multi_app: bool,
        previous: list[Action],
        cut_units: bool = True,
        fifo: tuple[list[Action], _Scored] | None = None,
    ) -> tuple[list[str], list[Action], dict[str, float]]:
        """The candidate plan for `live` with the fewest late requests among `planned` (then the
        least total completion), those requests and its completion times (module docstring).
        `previous`: a plan of the same requests to consider too, if not empty; `cut_units`:
        whether to try the units cut after their late requests when the others leave someone
        late; `fifo`: `dynamic`'s schedule of `live` and its score, if already made."""
        timed = self._actions(state, live, now_ms, "time", memo)
        scored_time = _late_and_total(state, live, planned, now_ms, timed)
        if fifo is None:
            fifo_actions = whole_model_schedule(state.deployment, live, now_ms, "never")
            fifo = fifo_actions, _late_and_total(state, live, planned, now_ms, fifo_actions)
        fifo_actions, scored_fifo = fifo
        if not scored_time.late:  # nobody late: the least total, or dynamic's if more slack
            if not scored_fifo.late and scored_fifo.least_slack_ms > scored_time.least_slack_ms:
                return [], fifo_actions, scored_fifo.completion
            return [], timed, scored_time.completion
        candidates = [timed, fifo_actions, self._actions(state, live, now_ms, "tardy", memo)]
        if multi_app:
            candidates.append(self._actions(state, live, now_ms, "tardy", memo, interleave=True))
        if previous:  # the previous plan without the requests dropped since
            candidates.append(previous)
        scored = [(scored_time, 0), (scored_fifo, 1)] + [
            (_late_and_total(state, live, planned, now_ms, a), n)
            for n, a in enumerate(candidates)
            if n > 1
        ]
        found, best = min(scored, key=lambda x: (len(x[0].late), x[0].total_ms, x[1]))
        if found.late and cut_units:  # the units cut after their late requests (module docstring)
            cut_after = frozenset(found.late)
            cut = self._actions(state, live, now_ms, "tardy", memo, cut_after=cut_after)
            cut_scored = _late_and_total(state, live, planned, now_ms, cut)
            if len(cut_scored.late) < len(found.late):
                return cut_scored.late, cut, cut_scored.completion
        return found.late, candidates[best], found.completion


class _Scored(NamedTuple):
    late: list[str]  # planned requests that finish after their deadline
    total_ms: float  # the total completion time
    completion: dict[str, float]  # of every request
    least_slack_ms: float  # the least, over the planned requests, of deadline less completion


def _late_and_total(
    state: SchedulerState,
    live: list[Request],
    planned: set[str],
    now_ms: float,
    actions: list[Action],
) -> _Scored:
    """How `actions` serve `live` (the running step counted from its start,
    `scheduler.timeline`): the planned requests they finish late, the total completion time and
    every request's completion time."""
    completion, _ = replay(state.deployment, live, now_ms, actions, state.running)
    slack = {r.id: r.deadline_ms - completion[r.id] for r in live if r.id in planned}
    late = [rid for rid, s in slack.items() if s < 0]
    least = min(slack.values(), default=math.inf)
    return _Scored(late, total_completion_ms(completion, now_ms), completion, least)


def _without(actions: list[Action], gone: set[str]) -> list[Action]:
    """The same schedule with some requests taken out (their batches shrink)."""
    out = []
    for a in actions:
        kept = tuple(r for r in a.request_ids if r not in gone)
        if kept:
            out.append(dataclasses.replace(a, request_ids=kept))
    return out


def _tail_actions(state: SchedulerState, tail: list[Request]) -> list[Action]:
    """Requests beyond the DP's window: per app in arrival order, segments of up to B."""
    d = state.deployment
    by_app: dict[str, list[Request]] = defaultdict(list)
    for r in tail:
        by_app[r.app].append(r)
    actions: list[Action] = []
    for app in sorted(by_app, key=lambda a: (by_app[a][0].arrival_ms, a)):
        bound = min(d.batch_limit(link.model) for link in d.chain(app))
        rs = by_app[app]
        for k in range(0, len(rs), bound):
            chunk = sorted((r.position, r.id) for r in rs[k : k + bound])
            actions.extend(walk(d, app, chunk, build=True).actions)
    return actions

"""Whole-model batching baselines: `dynamic` (Triton / Ray Serve) and `nexus`.

Both batch requests only when they stand at the same stage of the same model (normally its
first) and run the batch through the whole model: no merging at later layers.

dynamic: whenever the device is free, take the model holding the oldest waiting request, batch
  up to B waiting requests at that request's stage (oldest first) and run them to the model's end.
nexus:   the batch size for a model is the largest b <= B with 2 * T(b) <= the request's latency
  budget for that model (Nexus' worst case: one batch waits while the previous one runs);
  a model's budget is the request's deadline budget split over its app's models in proportion
  to their batch-1 latency. A batch starts when b requests wait, or when waiting any longer
  would make the oldest miss its budget (`Action.not_before_ms`). Requests past a model's first
  stage (a batch the runtime has started, or requests a client pre-processed) and requests
  without a deadline never wait.
tfs:     TF-Serving's batching (the Irina paper's baseline, section 4): per model, wait for as
  many requests as the deadline allows, then run the whole batch: the batch starts when B
  requests wait, or at the latest time the oldest could still finish by its deadline in a full
  batch of B (`Action.not_before_ms`), whichever comes first.
"""

from __future__ import annotations

import math
from bisect import insort
from collections import defaultdict
from typing import Literal

from scheduler.deployment import Deployment
from scheduler.policies.common import arrival_order, split_expired
from scheduler.state import SchedulerState
from scheduler.timeline import finish_plan
from scheduler.types import Action, Plan, Request

SLACK_MS = 1e-6  # aim this much before the budget's end, so rounding never makes it late


Waiting = Literal["never", "nexus", "tfs"]


class Dynamic:
    """Objective reported: total completion time (ms) of the plan."""

    name = "dynamic"
    waits: Waiting = "never"

    def plan(self, state: SchedulerState, now_ms: float) -> Plan:
        live, drops = split_expired(state, now_ms)
        actions = whole_model_schedule(state.deployment, live, now_ms, self.waits)
        return finish_plan(state, now_ms, actions, drops, policy=self.name)


class Nexus(Dynamic):
    name = "nexus"
    waits = "nexus"


class Tfs(Dynamic):
    name = "tfs"
    waits = "tfs"


def whole_model_schedule(
    d: Deployment, live: list[Request], now_ms: float, waits: Waiting
) -> list[Action]:
    """The schedule of the docstring's `waits` rule ("never": dynamic) for `live`, in arrival
    order, from `now_ms`: oldest first, each batch run to its model's end."""
    # the requests waiting at each (model, stage), oldest first: a batch leaves the front of one
    # queue, and those of its requests whose app goes on join the queue of their next model
    queues: dict[tuple[str, int], list[Request]] = defaultdict(list)
    for r in sorted(live, key=arrival_order):
        queues[d.locate(r.app, r.position)].append(r)
    t = now_ms
    actions: list[Action] = []
    while queues:
        (model, stage), queue = min(queues.items(), key=lambda kv: arrival_order(kv[1][0]))
        n_stages = d.profiles[model].num_stages
        size = d.batch_limit(model)
        start = t
        share_ms, budget_end = _budget_ms(d, queue[0], model)
        oldest = queue[0]
        if waits == "tfs" and len(queue) < size and math.isfinite(oldest.deadline_ms):
            full = d.run_ms(model, stage, n_stages, size)
            start = max(t, oldest.deadline_ms - full - SLACK_MS)
        elif waits == "nexus" and stage == 0 and math.isfinite(budget_end):
            size = _nexus_batch(d, model, stage, share_ms)
            if len(queue) < size:
                latest = budget_end - d.run_ms(model, stage, n_stages, len(queue)) - SLACK_MS
                start = max(t, latest)
            # if the queue grew while waiting, take no more than still lets the oldest leave
            # within its budget (when even one request cannot, keep the full batch size)
            fits = [
                n
                for n in range(1, min(size, len(queue)) + 1)
                if start + d.run_ms(model, stage, n_stages, n) <= budget_end
            ]
            if fits:
                size = fits[-1]
        batch = queue[:size]
        del queue[:size]
        if not queue:
            del queues[(model, stage)]
        not_before = start if start > t else None
        actions.append(Action(model, (stage, n_stages), tuple(r.id for r in batch), not_before))
        t = start + d.run_ms(model, stage, n_stages, len(batch))
        for r in batch:
            link = d.link_of(r.app, model)
            assert link is not None
            if link.end < d.app_length(r.app):
                insort(queues[d.locate(r.app, link.end)], r, key=arrival_order)
    return actions


def _budget_ms(d: Deployment, r: Request, model: str) -> tuple[float, float]:
    """`r`'s latency budget for `model` and the absolute time by which it should leave it: its
    deadline budget split over the app's models in proportion to their batch-1 latency."""
    chain = d.chain(r.app)
    solo = [d.run_ms(link.model, 0, link.num_stages, 1) for link in chain]
    total = sum(solo) or 1.0
    budget = r.deadline_ms - r.arrival_ms
    done = 0.0
    share = 0.0
    for link, s in zip(chain, solo, strict=True):
        done += s
        if link.model == model:
            share = s
            break
    return budget * share / total, r.arrival_ms + budget * done / total


def _nexus_batch(d: Deployment, model: str, stage: int, budget_ms: float) -> int:
    n = d.profiles[model].num_stages
    best = 1
    for b in range(1, d.batch_limit(model) + 1):
        if 2 * d.run_ms(model, stage, n, b) <= budget_ms:
            best = b
    return best

"""JSON documents of `layerbatch schedule`: apps.json and state.json in, a plan out.

apps.json:  {"apps": {"pose": ["detector", "pose_head"]}}
state.json: {"now_ms": 0.0, "max_batch": 16, "groups": null,
             "requests": [{"id": "r0", "app": "resnet50", "position": 3,
                           "arrival_ms": -12.5, "deadline_ms": 150.0}]}
`arrival_ms` and `deadline_ms` are absolute times on the clock of `now_ms`; a null or missing
deadline means none. `max_batch` and `groups` may be null or missing (profile bounds, G = 5).

`load_state` guarantees: no key outside STATE_KEYS (top level) and REQUEST_KEYS (each request)
is accepted, so a misspelt key is refused by name rather than ignored; every request arrived at
or before `now_ms` and its deadline (if any) is not before its arrival.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler.deployment import DEFAULT_GROUPS, Deployment
from scheduler.errors import InputError
from scheduler.profile import Profile
from scheduler.state import SchedulerState
from scheduler.types import App, Plan, Request
from scheduler.validate import (
    is_int,
    is_number,
    json_object,
    known_keys,
    nonempty_str,
    read_json,
)

STATE_KEYS = ("now_ms", "max_batch", "groups", "requests")
REQUEST_KEYS = ("id", "app", "position", "arrival_ms", "deadline_ms")


def load_apps(path: str | Path) -> list[App]:
    source = str(path)
    doc = json_object(read_json(path, "apps"), source, "")
    known_keys(doc, ("apps",), source, "")  # (a profile or state given as --apps is named so)
    if "apps" not in doc:
        raise InputError(
            source, "apps", 'an object of apps, {"APP": ["MODEL", ...]} (the key is missing)'
        )
    apps = json_object(doc["apps"], source, "apps")
    out = []
    for name, models in apps.items():
        if (
            not isinstance(models, list)
            or not models
            or not all(isinstance(m, str) and m for m in models)
        ):
            raise InputError(source, f"apps.{name}", "a non-empty list of model names", models)
        out.append(App(name, tuple(models)))
    return out


def with_model_apps(profiles: Sequence[Profile], apps: Sequence[App]) -> list[App]:
    """The given apps plus one app per model named after it (unless an app already has that
    name)."""
    names = {a.name for a in apps}
    return list(apps) + [App(p.model, (p.model,)) for p in profiles if p.model not in names]


@dataclass(frozen=True)
class Snapshot:
    state: SchedulerState
    now_ms: float


def load_state(
    path: str | Path,
    profiles: Sequence[Profile],
    apps: Sequence[App],
    groups: int | None = None,
    max_batch: int | None = None,
) -> Snapshot:
    """Parse state.json against the profiles and apps; `groups` and `max_batch` (from the
    command line) override the file's values."""
    source = str(path)
    doc = json_object(read_json(path, "state"), source, "")
    known_keys(doc, STATE_KEYS, source, "")
    now = doc.get("now_ms")
    if not is_number(now) or not math.isfinite(now):
        raise InputError(source, "now_ms", "a finite number (ms)", now)
    file_max_batch = doc.get("max_batch")
    if file_max_batch is not None and (not is_int(file_max_batch) or file_max_batch < 1):
        raise InputError(source, "max_batch", "a positive integer or null", file_max_batch)
    if max_batch is None:
        max_batch = file_max_batch
    g = doc.get("groups")
    if g is not None and (not is_int(g) or g < 1):
        raise InputError(source, "groups", "a positive integer or null", g)
    g = groups if groups is not None else (g if g is not None else DEFAULT_GROUPS)
    deployment = Deployment(profiles, with_model_apps(profiles, apps), max_batch, g, source)
    raw = doc.get("requests")
    if not isinstance(raw, list):
        raise InputError(source, "requests", "a list of requests", type(raw).__name__)
    state = SchedulerState(deployment)
    for i, item in enumerate(raw):
        request = _request(item, source, f"requests[{i}]", float(now))
        state.add(request, f"{source}: requests[{i}]")
    return Snapshot(state, float(now))


def _request(item: object, source: str, where: str, now_ms: float) -> Request:
    r = json_object(item, source, where)
    known_keys(r, REQUEST_KEYS, source, where)
    rid = nonempty_str(r.get("id"), source, f"{where}.id")
    app = nonempty_str(r.get("app"), source, f"{where}.app")
    pos = r.get("position", 0)
    if not is_int(pos):
        raise InputError(source, f"{where}.position", "an integer stage index", pos)
    arrival = r.get("arrival_ms")
    if not is_number(arrival) or not math.isfinite(arrival):
        raise InputError(source, f"{where}.arrival_ms", "a finite number (ms)", arrival)
    if arrival > now_ms:
        raise InputError(
            source,
            f"{where}.arrival_ms",
            f"an arrival at or before now_ms ({now_ms:g} ms)",
            arrival,
        )
    deadline = r.get("deadline_ms")
    if deadline is None:
        deadline = math.inf
    elif not is_number(deadline) or math.isnan(deadline):
        raise InputError(source, f"{where}.deadline_ms", "a number (ms) or null", deadline)
    elif deadline < arrival:
        raise InputError(
            source,
            f"{where}.deadline_ms",
            f"a deadline at or after the request's arrival_ms ({arrival:g} ms)",
            deadline,
        )
    return Request(rid, app, pos, float(arrival), float(deadline))


def plan_to_json(plan: Plan, plan_us: float) -> dict[str, Any]:
    """The plan document (keys as in the README)."""
    actions = []
    for a in plan.actions:
        item: dict[str, Any] = {
            "model": a.model,
            "stages": list(a.stages),
            "requests": list(a.request_ids),
        }
        if a.not_before_ms is not None:
            item["not_before_ms"] = _r(a.not_before_ms)
        actions.append(item)
    return {
        "policy": plan.policy,
        "actions": actions,
        "completion_ms": {k: _r(v) for k, v in plan.completion_ms.items()},
        "dropped": list(plan.dropped_ids),
        "drop_reasons": {d.request_id: d.reason for d in plan.dropped},
        "objective": _r(plan.objective),
        "plan_us": round(plan_us),
    }


def _r(x: float) -> float:
    return round(x, 4)

"""Every scheduling policy, selectable by name (`make_policy`)."""

from __future__ import annotations

from scheduler.dp import UnitMode
from scheduler.errors import InputError
from scheduler.policies.batch import Batch
from scheduler.policies.dp import DEFAULT_MAX_ACTIVE, DPScheduler
from scheduler.policies.edf import EDF
from scheduler.policies.irina import Irina
from scheduler.policies.nobatch import NoBatch
from scheduler.policies.whole_model import Dynamic, Nexus, Tfs
from scheduler.types import Scheduler

POLICIES = ("nobatch", "dynamic", "batch", "nexus", "edf", "dp-time", "dp-tardy", "tfs", "irina")
# the policies that drop a request their plan would finish after its deadline (`PREDICTED_LATE`)
DROPS_LATE = frozenset({"dp-tardy"})


def make_policy(
    name: str,
    exact: bool = False,
    unit: UnitMode | None = None,
    max_active: int = DEFAULT_MAX_ACTIVE,
    memory_bytes: float | None = None,
) -> Scheduler:
    """The policy called `name`. `exact` (or unit="request") selects the DP's per-request form;
    unit="layer" the layer-unit form; the default is layer groups (the deployment's G).
    `memory_bytes`: the activation budget `irina` keeps two stacked actions within."""
    mode: UnitMode = "request" if exact else (unit or "group")
    if name == "dp-time":
        return DPScheduler("time", mode, max_active)
    if name == "dp-tardy":
        return DPScheduler("tardy", mode, max_active)
    if name == "irina":
        return Irina(memory_bytes=memory_bytes)
    simple: dict[str, type[Scheduler]] = {
        "nobatch": NoBatch,
        "dynamic": Dynamic,
        "batch": Batch,
        "nexus": Nexus,
        "edf": EDF,
        "tfs": Tfs,
    }
    if name not in simple:
        raise InputError("--policy", "", f"one of {', '.join(POLICIES)}", name)
    return simple[name]()


__all__ = ["DROPS_LATE", "POLICIES", "make_policy"]

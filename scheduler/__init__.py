"""Pure scheduling policy: request and plan types, DP schedulers, EDF and the baselines.

Imports only the standard library, numpy and scipy; never reads the clock (DESIGN.md).
"""

from scheduler.deployment import Deployment
from scheduler.errors import InputError
from scheduler.policies import POLICIES, make_policy
from scheduler.profile import Profile, load_profile, parse_profile
from scheduler.state import SchedulerState
from scheduler.types import Action, App, Drop, Plan, Request, Scheduler

__all__ = [
    "POLICIES",
    "Action",
    "App",
    "Deployment",
    "Drop",
    "InputError",
    "Plan",
    "Profile",
    "Request",
    "Scheduler",
    "SchedulerState",
    "load_profile",
    "make_policy",
    "parse_profile",
]

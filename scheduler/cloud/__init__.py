"""Cloud cost planner (issue 7; Harpagon and Piccolo): pure policy, no clock, no torch.

`parse_workload` validates a workload document, `plan` returns the plan document for one of
`SYSTEMS`: harpagon, piccolo, the baselines nexus, scrooge, inferline and clipper, and optimal.
"""

from scheduler.cloud.planner import SYSTEMS, System, plan
from scheduler.cloud.workload import App, Config, Workload, parse_workload

__all__ = ["SYSTEMS", "App", "Config", "System", "Workload", "parse_workload", "plan"]

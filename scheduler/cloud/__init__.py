"""Cloud cost planner (issue 7; Harpagon and Piccolo): pure policy, no clock, no torch.

`parse_workload` validates a workload document, `plan` returns the plan document.
"""

from scheduler.cloud.planner import SYSTEMS, plan
from scheduler.cloud.workload import App, Config, Workload, parse_workload

__all__ = ["SYSTEMS", "App", "Config", "Workload", "parse_workload", "plan"]

"""Where layerbatch's time went during one measured run, from its /metrics before and after.

The server counts milliseconds of work by kind (`layerbatch_busy_ms_total{work=...}`: steps on
the executor thread, decodes, stacked actions), the hand-offs between two steps
(`layerbatch_step_gap_ms_sum`) and its planning (`layerbatch_plan_us_sum`, on the loop thread,
beside the steps). Each share is the counter's growth over the run divided by the run's wall
time. Decodes on the executor thread run between steps, inside the gaps, so there the gaps'
share counts them too (the shares can add to more than 1), and steps + gaps near 1 means the
executor thread never waited for work.
"""

from __future__ import annotations

from collections.abc import Mapping

# share name -> (metric line prefix, factor to milliseconds)
COUNTERS = {
    "steps": ('layerbatch_busy_ms_total{work="step"}', 1.0),
    "decodes": ('layerbatch_busy_ms_total{work="decode"}', 1.0),
    "stacked": ('layerbatch_busy_ms_total{work="stacked"}', 1.0),
    "gaps": ("layerbatch_step_gap_ms_sum{}", 1.0),
    "plans": ("layerbatch_plan_us_sum{}", 1e-3),
}


def busy_counters(metrics_text: str) -> dict[str, float]:
    """The COUNTERS in a /metrics page, in milliseconds (a counter not yet on the page is 0)."""
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in metrics_text.splitlines():
        for name, (prefix, to_ms) in COUNTERS.items():
            if line.startswith(prefix + " "):
                out[name] = float(line[len(prefix) + 1 :]) * to_ms
    return out


def busy_shares(
    before: Mapping[str, float], after: Mapping[str, float], wall_ms: float
) -> dict[str, float]:
    """Each counter's growth from `before` to `after` as a share of `wall_ms` (3 decimals)."""
    if wall_ms <= 0:
        raise ValueError(f"wall_ms: expected a positive duration, got {wall_ms}")
    return {k: round((after[k] - before[k]) / wall_ms, 3) for k in COUNTERS}


def busy_line(shares: Mapping[str, float]) -> str:
    """'steps 76% decodes 12% gaps 18% plans 8%' (stacked only when it ran)."""
    return " ".join(f"{k} {v:.0%}" for k, v in shares.items() if k != "stacked" or v > 0)

"""Counters and histograms for /metrics (Prometheus text format 0.0.4) and /v1/status."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Sequence

COMPLETION_BUCKETS_MS = (5, 10, 20, 50, 100, 150, 200, 300, 500, 1000, 2000, 5000)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
PLAN_BUCKETS_US = (50, 100, 200, 500, 1000, 2000, 5000, 10000, 50000)
GAP_BUCKETS_MS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
RATIO_BUCKETS = (0.5, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0)


class Histogram:
    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: str) -> list[str]:
        sep = "," if labels else ""
        out, running = [], 0
        for bound, count in zip((*self.bounds, "+Inf"), self.counts, strict=True):
            running += count
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {running}')
        out.append(f"{name}_sum{{{labels}}} {self.total!r}")  # full precision
        out.append(f"{name}_count{{{labels}}} {self.n}")
        return out


class Metrics:
    """Everything the server counts; mutated on the event loop only."""

    def __init__(self) -> None:
        self.answered: Counter[tuple[str, str]] = Counter()  # (app, status)
        self.on_time: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()  # reason
        # made on first use (the loop records every stage of every step: a setdefault would
        # build a histogram each time)
        self.completion: defaultdict[str, Histogram] = defaultdict(
            lambda: Histogram(COMPLETION_BUCKETS_MS)
        )
        self.batch: defaultdict[tuple[str, int], Histogram] = defaultdict(
            lambda: Histogram(BATCH_BUCKETS)
        )
        self.plan = Histogram(PLAN_BUCKETS_US)
        # measured / profiled time of every completed step: how well the profiles fit this machine
        self.step_ratio = Histogram(RATIO_BUCKETS)
        # the executor's idle time between a step and the next, when the next was ready at once
        self.step_gap = Histogram(GAP_BUCKETS_MS)
        self.preempted = 0
        self.stacked = 0  # actions run beside another (stacking)
        # milliseconds of work by kind: "step" (the executor thread's actions, preempted ones
        # too), "decode" (inputs, on whichever thread decodes), "stacked" (the second lane)
        self.busy_ms: defaultdict[str, float] = defaultdict(float)

    def answer(self, app: str, status: str, total_ms: float | None, on_time: bool) -> None:
        self.answered[(app, status)] += 1
        if total_ms is not None:
            self.completion[app].observe(total_ms)
        if on_time:
            self.on_time[app] += 1

    def ran(self, model: str, stages: range, batch: int) -> None:
        for k in stages:
            self.batch[(model, k)].observe(batch)

    def render(self, queue: dict[tuple[str, int], int]) -> str:
        lines = ["# TYPE layerbatch_requests_total counter"]
        for (app, status), n in sorted(self.answered.items()):
            lines.append(f'layerbatch_requests_total{{app="{app}",status="{status}"}} {n}')
        lines.append("# TYPE layerbatch_on_time_total counter")
        for app, n in sorted(self.on_time.items()):
            lines.append(f'layerbatch_on_time_total{{app="{app}"}} {n}')
        lines.append("# TYPE layerbatch_dropped_total counter")
        for reason, n in sorted(self.dropped.items()):
            lines.append(f'layerbatch_dropped_total{{reason="{reason}"}} {n}')
        lines.append("# TYPE layerbatch_preempted_total counter")
        lines.append(f"layerbatch_preempted_total {self.preempted}")
        lines.append("# TYPE layerbatch_stacked_total counter")
        lines.append(f"layerbatch_stacked_total {self.stacked}")
        lines.append("# TYPE layerbatch_busy_ms_total counter")
        for work, ms in sorted(self.busy_ms.items()):
            lines.append(f'layerbatch_busy_ms_total{{work="{work}"}} {ms!r}')
        lines.append("# TYPE layerbatch_completion_ms histogram")
        for app, h in sorted(self.completion.items()):
            lines += h.lines("layerbatch_completion_ms", f'app="{app}"')
        lines.append("# TYPE layerbatch_batch_size histogram")
        for (model, k), h in sorted(self.batch.items()):
            lines += h.lines("layerbatch_batch_size", f'model="{model}",stage="{k}"')
        lines.append("# TYPE layerbatch_plan_us histogram")
        lines += self.plan.lines("layerbatch_plan_us", "")
        lines.append("# TYPE layerbatch_step_time_ratio histogram")
        lines += self.step_ratio.lines("layerbatch_step_time_ratio", "")
        lines.append("# TYPE layerbatch_step_gap_ms histogram")
        lines += self.step_gap.lines("layerbatch_step_gap_ms", "")
        lines.append("# TYPE layerbatch_queued gauge")
        for (model, k), n in sorted(queue.items()):
            lines.append(f'layerbatch_queued{{model="{model}",stage="{k}"}} {n}')
        return "\n".join(lines) + "\n"

"""What really runs on the pipeline workers and NIC links in the data-plane simulator (paper 004,
sections 5.4 and 7.4).

A task occupies one resource (a GPU task on its worker) or two at once (a transfer: the sender's
uplink and the receiver's downlink, both for the whole transfer). Each task has an earliest start
(its reserved start under PPipe, its issue time under the reactive baseline) and its key
(earliest start, id); every resource serves its tasks strictly in key order. A task starts at

    start = max(earliest start, the time all its predecessors finished,
                the time it is the first unserved task of each of its resources and they are idle)

and runs for base x slowdown x LogNormal(-sigma^2 / 2, sigma) (GPU tasks; a factor of mean
slowdown drawn from the rng when the task starts) or exactly base (transfers: bytes x 8 / NIC bit rate). Waits point
only to tasks with smaller keys (a predecessor's earliest start is not later and its id is
smaller), so nothing deadlocks. Events sit in a heap keyed (time_ms, priority, seq): a finish
before a retry before an arrival before a wake-up.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

DONE, RETRY, ARRIVAL, WAKE = 0, 1, 2, 3
GPU_TASK, NET_TASK = "gpu", "net"


@dataclass(eq=False)
class Task:
    """One GPU run or one transfer of a batch. `owner` is the policy's batch record."""

    id: int
    kind: str
    resources: tuple[int, ...]
    earliest_ms: float
    base_ms: float
    stage: int
    owner: object
    slots: tuple[int, ...] = ()  # reservation slot ids (PPipe), one per resource
    preds: int = 0
    succs: list[Task] = field(default_factory=list)
    start_ms: float = float("nan")
    end_ms: float = float("nan")
    retry_at_ms: float | None = None
    began: bool = False


class Events:
    """The event heap, keyed (time_ms, priority, seq)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0

    def push(self, time_ms: float, priority: int, payload: object) -> None:
        heapq.heappush(self._heap, (time_ms, priority, self._seq, payload))
        self._seq += 1

    def pop(self) -> tuple[float, int, object]:
        time_ms, priority, _, payload = heapq.heappop(self._heap)
        return time_ms, priority, payload

    def peek(self) -> tuple[float, int] | None:
        return (self._heap[0][0], self._heap[0][1]) if self._heap else None

    def __bool__(self) -> bool:
        return bool(self._heap)


@dataclass(frozen=True)
class Noise:
    """GPU time factor: slowdown x LogNormal(-sigma^2 / 2, sigma), a factor of mean slowdown
    (sigma 0: exactly slowdown)."""

    sigma: float = 0.0
    slowdown: float = 1.0

    def factor(self, rng: np.random.Generator) -> float:
        if self.sigma <= 0:
            return self.slowdown
        return self.slowdown * float(rng.lognormal(-0.5 * self.sigma**2, self.sigma))


class Executor:
    """Runs submitted tasks (module docstring); calls `on_start(task, now)` and
    `on_done(task, now)` as they start and finish (before their successors are tried)."""

    def __init__(
        self,
        resources: int,
        events: Events,
        rng: np.random.Generator,
        noise: Noise,
        on_start: Callable[[Task, float], None],
        on_done: Callable[[Task, float], None],
    ) -> None:
        self._queues: list[list[tuple[float, int, Task]]] = [[] for _ in range(resources)]
        self._busy = [False] * resources
        self._events = events
        self._rng = rng
        self._noise = noise
        self._on_start = on_start
        self._on_done = on_done
        self._next_id = 0

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def submit(self, tasks: list[Task], now_ms: float) -> None:
        """Queue `tasks` (ids from `new_id`, predecessors before successors) and start any that
        can start now."""
        for task in tasks:
            for r in task.resources:
                heapq.heappush(self._queues[r], (task.earliest_ms, task.id, task))
        for task in tasks:
            self.try_start(task, now_ms)

    def try_start(self, task: Task, now_ms: float) -> None:
        """Start `task` if it can start at `now_ms`; if only its earliest start is missing,
        come back then (a RETRY event)."""
        if task.began or task.preds:
            return
        for r in task.resources:
            if self._busy[r] or self._queues[r][0][2] is not task:
                return
        if task.earliest_ms > now_ms:
            if task.retry_at_ms != task.earliest_ms:
                task.retry_at_ms = task.earliest_ms
                self._events.push(task.earliest_ms, RETRY, task)
            return
        for r in task.resources:
            heapq.heappop(self._queues[r])
            self._busy[r] = True
        task.began = True
        task.start_ms = now_ms
        factor = self._noise.factor(self._rng) if task.kind == GPU_TASK else 1.0
        task.end_ms = now_ms + task.base_ms * factor
        self._events.push(task.end_ms, DONE, task)
        self._on_start(task, now_ms)

    def finish(self, task: Task, now_ms: float) -> None:
        """The DONE event of `task`: free its resources, report it, start what can start."""
        for r in task.resources:
            self._busy[r] = False
        self._on_done(task, now_ms)
        for succ in task.succs:
            succ.preds -= 1
            self.try_start(succ, now_ms)
        for r in task.resources:
            queue = self._queues[r]
            if queue and not self._busy[r]:
                self.try_start(queue[0][2], now_ms)

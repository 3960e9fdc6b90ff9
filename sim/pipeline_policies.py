"""The two data-plane policies over one pipeline plan (paper 004, section 5.4, A.3 and 7.4).

PPipe (Algorithm 1), run whenever requests arrive and at the wake-up it asked for; q is the queue
in arrival order, D = deadline(q[0]) - guard_ms, B_i pipeline i's planned batch:
    1. i* = argmin_i waitTime(probe(i, B_i))                         (the first on ties)
    2. bs = the largest b <= B_i* with finish(probe(i*, b)) <= D;
       none: drop q[0] (an SLO miss) and go to 1. (`fallback`, not in the paper: first try
       the other pipelines in order of waiting time, and drop only if none meets D.)
    3. |q| >= bs: reserve(probe(i*, bs)), dispatch q[:bs] along its path, go to 1.
       |q| <  bs: b' = the largest b <= |q| that meets D (none: drop q[0], go to 1); wait for
       more until L = start(probe) + (D - guard_ms) - finish(probe), the last moment the first GPU
       could start and still leave guard_ms for estimates that grew meanwhile (feedback):
       L > now: wait until L or the next arrival; else dispatch q[:b'] now.
Probes see compute times profiled(b) x c_{i,d}, c the pool's feedback correction: an EWMA
(weight `ewma`) of measured / profiled time of its finished GPU runs, starting at 1.
The reservation table follows what really ran (`ReservationTable.started` / `finished`).

Reactive (the 7.4 baseline): arrivals go to pipelines by smooth weighted round-robin on their
planned throughput; every pool keeps a FIFO queue; whenever one of its workers is idle it takes
the oldest up to B_i queued requests (dropping those already past their deadline), pulls their
input cuts from the servers that hold them (FIFO on the links, no reservation) and runs them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from sim.pipeline_exec import GPU_TASK, NET_TASK, WAKE, Events, Executor, Task
from sim.pipeline_layout import Layout
from sim.reservation import Probe, ReservationTable, StageSpec, Worker

_EPS_MS = 1e-9


@dataclass(frozen=True)
class Timing:
    """Profiled times per pool: `compute_ms[i][d][b]` and `transfer_ms[i][d][b]` (the input
    cut of partition d at batch b; 0 for d = 0), index b from 1 (entry 0 unused)."""

    compute_ms: tuple[tuple[tuple[float, ...], ...], ...]
    transfer_ms: tuple[tuple[tuple[float, ...], ...], ...]
    batch: tuple[int, ...]
    rate_rps: tuple[float, ...]


@dataclass
class Requests:
    """Per request: arrival, deadline, finish (nan until done) and drop flag."""

    arrival_ms: np.ndarray
    deadline_ms: np.ndarray
    finish_ms: np.ndarray
    dropped: np.ndarray


@dataclass(eq=False)
class Batch:
    """Requests that run together through pipeline `pipeline` (from partition `partition` on
    under the reactive policy, which re-forms batches at every pool)."""

    pipeline: int
    partition: int
    requests: list[int]
    worker: Worker | None = None


class PPipePolicy:
    """Algorithm 1 over the reservation table (module docstring)."""

    name = "ppipe"

    def __init__(
        self,
        layout: Layout,
        timing: Timing,
        requests: Requests,
        executor: Executor,
        events: Events,
        guard_ms: float,
        ewma: float,
        fallback: bool = False,
    ) -> None:
        self._layout = layout
        self._timing = timing
        self._req = requests
        self._exec = executor
        self._events = events
        self._guard_ms = guard_ms
        self._ewma = ewma
        self._fallback = fallback
        self.table = ReservationTable(layout.resources)
        self.correction = [[1.0] * len(pipe) for pipe in layout.pools]
        self._servers = [
            [frozenset(w.server for w in p.workers) for p in pipe] for pipe in layout.pools
        ]
        self._queue: deque[int] = deque()
        self._wake_token = 0
        self.probes = 0
        self.batch_sizes: list[int] = []

    def _stages(self, i: int, b: int) -> list[StageSpec]:
        pools = self._layout.pools[i]
        comp, net, corr = (
            self._timing.compute_ms[i],
            self._timing.transfer_ms[i],
            self.correction[i],
        )
        return [
            StageSpec(pool.workers, comp[d][b] * corr[d], net[d][b], self._servers[i][d])
            for d, pool in enumerate(pools)
        ]

    def _probe(self, i: int, b: int, now_ms: float) -> Probe:
        self.probes += 1
        return self.table.probe(self._stages(i, b), now_ms)

    def _largest(
        self, i: int, top: int, limit_ms: float, now_ms: float, first: Probe | None = None
    ) -> tuple[int, Probe | None]:
        for b in range(top, 0, -1):
            pr = first if (first is not None and b == top) else self._probe(i, b, now_ms)
            if pr.finish_ms <= limit_ms + _EPS_MS:
                return b, pr
        return 0, None

    def arrive(self, rids: list[int], now_ms: float) -> None:
        self._queue.extend(rids)
        self.schedule(now_ms)

    def wake(self, token: object, now_ms: float) -> None:
        if token == self._wake_token:
            self.schedule(now_ms)

    def schedule(self, now_ms: float) -> None:
        """Algorithm 1 until the queue is empty or it decides to wait."""
        q = self._queue
        batch = self._timing.batch
        while q:
            first = [self._probe(i, batch[i], now_ms) for i in range(len(batch))]
            order = sorted(range(len(batch)), key=lambda i: first[i].wait_ms)  # stable: ties first
            limit_ms = float(self._req.deadline_ms[q[0]]) - self._guard_ms
            bs, pr, i = 0, None, order[0]
            for i in order if self._fallback else order[:1]:
                bs, pr = self._largest(i, batch[i], limit_ms, now_ms, first[i])
                if pr is not None:
                    break
            if pr is None:
                self._drop(q.popleft())
                continue
            if len(q) < bs:
                bs, pr = self._largest(i, len(q), limit_ms, now_ms)
                if pr is None:
                    self._drop(q.popleft())
                    continue
                latest_ms = pr.start_ms + (limit_ms - self._guard_ms - pr.finish_ms)
                if latest_ms > now_ms + _EPS_MS:
                    self._wake_token += 1
                    self._events.push(latest_ms, WAKE, self._wake_token)
                    return
            self._dispatch(i, bs, pr, now_ms)

    def _drop(self, rid: int) -> None:
        self._req.dropped[rid] = True

    def _dispatch(self, i: int, bs: int, pr: Probe, now_ms: float) -> None:
        ids = self.table.reserve(pr)
        owner = Batch(i, 0, [self._queue.popleft() for _ in range(bs)])
        self.batch_sizes.append(bs)
        tasks: list[Task] = []
        k = 0
        comp, net = self._timing.compute_ms[i], self._timing.transfer_ms[i]
        while k < len(pr.slots):
            slot = pr.slots[k]
            d = slot.stage
            if slot.kind != "gpu":  # an uplink slot and its downlink twin
                down = pr.slots[k + 1]
                task = Task(
                    self._exec.new_id(),
                    NET_TASK,
                    (slot.resource, down.resource),
                    slot.start_ms,
                    net[d][bs],
                    d,
                    owner,
                    (ids[k], ids[k + 1]),
                )
                k += 2
            else:
                task = Task(
                    self._exec.new_id(),
                    GPU_TASK,
                    (slot.resource,),
                    slot.start_ms,
                    comp[d][bs],
                    d,
                    owner,
                    (ids[k],),
                )
                k += 1
            if tasks:
                tasks[-1].succs.append(task)
                task.preds = 1
            tasks.append(task)
        self._exec.submit(tasks, now_ms)

    def started(self, task: Task, now_ms: float) -> None:
        assert isinstance(task.owner, Batch)
        expected_ms = task.base_ms
        if task.kind == GPU_TASK:
            expected_ms *= self.correction[task.owner.pipeline][task.stage]
        for slot in task.slots:
            self.table.started(slot, now_ms, expected_ms)

    def done(self, task: Task, now_ms: float) -> None:
        owner = task.owner
        assert isinstance(owner, Batch)
        for slot in task.slots:
            self.table.finished(slot, now_ms)
        if task.kind != GPU_TASK:
            return
        corr = self.correction[owner.pipeline]
        measured = (task.end_ms - task.start_ms) / task.base_ms
        corr[task.stage] += self._ewma * (measured - corr[task.stage])
        if task.stage == len(corr) - 1:
            self._req.finish_ms[owner.requests] = now_ms


class ReactivePolicy:
    """Per-pool queues, batches of whatever is queued when a worker is idle (module docstring)."""

    name = "reactive"

    def __init__(
        self, layout: Layout, timing: Timing, requests: Requests, executor: Executor
    ) -> None:
        self._layout = layout
        self._timing = timing
        self._req = requests
        self._exec = executor
        # per pool: (request, uplink resource of the server holding its input or -1, server)
        self._queues: list[list[deque[tuple[int, int, int]]]] = [
            [deque() for _ in pipe] for pipe in layout.pools
        ]
        self._idle: list[list[deque[Worker]]] = [
            [deque(pool.workers) for pool in pipe] for pipe in layout.pools
        ]
        self._credit = [0.0] * len(layout.pools)
        self.probes = 0
        self.batch_sizes: list[int] = []

    def _route(self) -> int:
        """Smooth weighted round-robin on the planned throughputs."""
        rates = self._timing.rate_rps
        total = sum(rates)
        for i, rate in enumerate(rates):
            self._credit[i] += rate
        best = max(range(len(rates)), key=lambda i: self._credit[i])
        self._credit[best] -= total
        return best

    def arrive(self, rids: list[int], now_ms: float) -> None:
        touched = set()
        for rid in rids:
            i = self._route()
            self._queues[i][0].append((rid, -1, -1))
            touched.add(i)
        for i in sorted(touched):
            self._fill(i, 0, now_ms)

    def wake(self, token: object, now_ms: float) -> None:
        """The reactive policy never asks for a wake-up."""

    def _fill(self, i: int, d: int, now_ms: float) -> None:
        queue, idle = self._queues[i][d], self._idle[i][d]
        top = self._timing.batch[i]
        deadline = self._req.deadline_ms
        while idle and queue:
            take: list[tuple[int, int, int]] = []
            while queue and len(take) < top:
                item = queue.popleft()
                if deadline[item[0]] < now_ms:
                    self._req.dropped[item[0]] = True
                else:
                    take.append(item)
            if not take:
                return
            w = idle.popleft()
            owner = Batch(i, d, [rid for rid, _, _ in take], w)
            if d == 0:
                self.batch_sizes.append(len(take))
            per_sample_ms = self._timing.transfer_ms[i][d][1]
            senders: dict[int, int] = {}
            for _, uplink, server in take:
                if uplink >= 0 and server != w.server and per_sample_ms > 0:
                    senders[uplink] = senders.get(uplink, 0) + 1
            tasks = [
                Task(
                    self._exec.new_id(),
                    NET_TASK,
                    (uplink, w.downlink),
                    now_ms,
                    self._timing.transfer_ms[i][d][count],
                    d,
                    owner,
                )
                for uplink, count in senders.items()
            ]
            gpu = Task(
                self._exec.new_id(),
                GPU_TASK,
                (w.gpu,),
                now_ms,
                self._timing.compute_ms[i][d][len(take)],
                d,
                owner,
                preds=len(tasks),
            )
            for net in tasks:
                net.succs.append(gpu)
            tasks.append(gpu)
            self._exec.submit(tasks, now_ms)

    def started(self, task: Task, now_ms: float) -> None:
        """Nothing to correct: the reactive policy keeps no reservations."""

    def done(self, task: Task, now_ms: float) -> None:
        if task.kind != GPU_TASK:
            return
        owner = task.owner
        assert isinstance(owner, Batch) and owner.worker is not None
        i, d, w = owner.pipeline, owner.partition, owner.worker
        if d == len(self._layout.pools[i]) - 1:
            self._req.finish_ms[owner.requests] = now_ms
        else:
            self._queues[i][d + 1].extend((rid, w.uplink, w.server) for rid in owner.requests)
            self._fill(i, d + 1, now_ms)
        self._idle[i][d].append(w)
        self._fill(i, d, now_ms)

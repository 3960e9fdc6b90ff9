"""Reservation tables of PPipe's data plane: probe() and reserve() (paper 004, section 5.4, A.3).

Resources are numbered 0..R-1: every worker (one virtual GPU of a partition's pool) and every
server's NIC uplink and downlink. Each keeps its reserved intervals [start_ms, end_ms), sorted and
non-overlapping. Formulation (Algorithm 2):

    earliestSlot(res, t, l) = least s >= t with [s, s + l) free on every resource of res
        (s <- t; repeat: for r in res, s <- start of r's first gap at or after s that is l long;
         until no resource moved s).
    probe(stages, now): t_g <- now; for each partition d, for each worker w of its pool:
        t <- t_g;
        if d > 0 and the cut's transfer takes l_n > 0 and w is not on the previous worker's server:
            t <- earliestSlot([up(prev), down(w)], t, l_n) + l_n   (both links at once)
        t <- earliestSlot([w], t, l_i) + l_i;
        keep the w with the least t (the first on ties); t_g <- that t.
    The answer: the path, its slots, its finish time t_g and its waiting time (the sum over slots
    of start - the time the slot could have started: the delays waiting for resources).
    (Shortcuts, same answer: the scan stops at a worker finishing at t_g + l_i, or t_g + l_n + l_i
    when no worker shares the previous one's server, and skips remote workers once the best
    finish is at most t_g + l_n + l_i.)
    reserve(probe) marks the slots busy.

Feedback correction (5.4): `started(slot, t, l)` moves a slot to where it really began (after the
slots that already ran on its resource) with the duration now expected, `finished(slot, t)` sets
its real end; either way the later slots of that resource that now overlap are pushed back in
order. Finished slots are forgotten.

Cost: earliestSlot on one resource is O(log n + k) (n intervals, k of them skipped); probe is
O(sum_d |pool_d| (log n + k)), reserve O(n) per slot (list insertion; n stays small because
finished slots are pruned).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

GPU, UPLINK, DOWNLINK = "gpu", "up", "down"
_EPS_MS = 1e-9


@dataclass(frozen=True)
class Worker:
    """One virtual GPU: its own resource and its server's NIC resources."""

    gpu: int
    server: int
    uplink: int
    downlink: int


@dataclass(frozen=True)
class StageSpec:
    """One partition as probe() sees it: the pool, the compute time of the batch on one of its
    workers, and the time to move the batch's input cut over a NIC (unused for stage 0)."""

    pool: tuple[Worker, ...]
    compute_ms: float
    transfer_ms: float
    servers: frozenset[int] = frozenset()  # the pool's servers, if known: lets probe stop early


@dataclass(frozen=True)
class Slot:
    """A reservation: `resource` busy over [start_ms, end_ms) for `stage` of a batch."""

    resource: int
    start_ms: float
    end_ms: float
    stage: int
    kind: str  # GPU, UPLINK or DOWNLINK


@dataclass(frozen=True)
class Probe:
    """probe()'s answer: the chosen worker per stage (index into its pool), the slots in order
    (per stage: uplink and downlink if the input crosses a NIC, then the GPU), the first GPU
    slot's start, the finish time and the waiting time."""

    workers: tuple[int, ...]
    slots: tuple[Slot, ...]
    start_ms: float
    finish_ms: float
    wait_ms: float


class ReservationTable:
    """Reserved intervals of R resources; see the module docstring."""

    def __init__(self, resources: int) -> None:
        self._starts: list[list[float]] = [[] for _ in range(resources)]
        self._ends: list[list[float]] = [[] for _ in range(resources)]
        self._ids: list[list[int]] = [[] for _ in range(resources)]
        self._started = [0] * resources  # leading slots that really began (done or running)
        self._where: dict[int, tuple[int, float]] = {}  # slot id -> (resource, current start)
        self._finished: set[int] = set()  # finished slots not yet pruned
        self._next_id = 0

    @property
    def resources(self) -> int:
        return len(self._starts)

    def intervals(self, resource: int) -> list[tuple[float, float]]:
        """The reserved intervals of `resource` still remembered, in order."""
        return list(zip(self._starts[resource], self._ends[resource], strict=True))

    def earliest_ms(self, resources: Sequence[int], after_ms: float, duration_ms: float) -> float:
        """earliestSlot(resources, after_ms, duration_ms) of Algorithm 2."""
        start = after_ms
        while True:
            moved = False
            for r in resources:
                s = self._earliest_one(r, start, duration_ms)
                if s != start:
                    start, moved = s, True
            if not moved:
                return start

    def _earliest_one(self, r: int, after_ms: float, duration_ms: float) -> float:
        starts, ends = self._starts[r], self._ends[r]
        i = bisect_right(ends, after_ms)
        s = after_ms
        n = len(starts)
        while i < n and starts[i] < s + duration_ms:
            if ends[i] > s:
                s = ends[i]
            i += 1
        return s

    def probe(self, stages: Sequence[StageSpec], now_ms: float) -> Probe:
        """The greedy path of Algorithm 2 through `stages` for a batch ready at `now_ms`.

        Changes nothing. Raises ValueError for no stages or an empty pool.
        """
        if not stages:
            raise ValueError("probe needs at least one stage")
        t_g = now_ms
        prev: Worker | None = None
        chosen: list[int] = []
        slots: list[Slot] = []
        wait_ms = 0.0
        first_start = now_ms
        for d, stage in enumerate(stages):
            if not stage.pool:
                raise ValueError(f"stage {d} has no workers")
            l_n, l_i = stage.transfer_ms, stage.compute_ms
            best_t = float("inf")
            best: tuple[int, float | None, float, float] | None = None
            net_by_server: dict[int, float] = {}
            crosses = prev is not None and l_n > 0
            prev_server = prev.server if prev is not None else -1
            # No worker finishes before `bound` (`remote_floor` if its input crosses a NIC):
            # stop at the first worker that reaches it, skip those that cannot beat the best.
            remote_floor = t_g + l_n + l_i
            remote_only = crosses and bool(stage.servers) and prev_server not in stage.servers
            bound = remote_floor if remote_only else t_g + l_i
            starts_all, ends_all = self._starts, self._ends
            for w_index, w in enumerate(stage.pool):
                net_start: float | None = None
                if crosses and w.server != prev_server:
                    if remote_floor >= best_t:
                        continue
                    net_start = net_by_server.get(w.server)
                    if net_start is None:
                        assert prev is not None
                        net_start = self.earliest_ms((prev.uplink, w.downlink), t_g, l_n)
                        net_by_server[w.server] = net_start
                    ready = net_start + l_n
                else:
                    ready = t_g
                gpu_start = ready  # _earliest_one(w.gpu, ready, l_i), inlined: the hot loop
                ends = ends_all[w.gpu]
                if ends and ends[-1] > ready:
                    starts = starts_all[w.gpu]
                    i = bisect_right(ends, ready)
                    n = len(starts)
                    while i < n and starts[i] < gpu_start + l_i:
                        if ends[i] > gpu_start:
                            gpu_start = ends[i]
                        i += 1
                t = gpu_start + l_i
                if t < best_t:
                    best_t = t
                    best = (w_index, net_start, gpu_start, t)
                    if t <= bound:
                        break
            assert best is not None
            w_index, net_start, gpu_start, t = best
            w = stage.pool[w_index]
            ready = t_g
            if net_start is not None and prev is not None:
                slots.append(Slot(prev.uplink, net_start, net_start + l_n, d, UPLINK))
                slots.append(Slot(w.downlink, net_start, net_start + l_n, d, DOWNLINK))
                wait_ms += net_start - ready
                ready = net_start + l_n
            slots.append(Slot(w.gpu, gpu_start, t, d, GPU))
            wait_ms += gpu_start - ready
            if d == 0:
                first_start = gpu_start
            chosen.append(w_index)
            t_g, prev = t, w
        return Probe(tuple(chosen), tuple(slots), first_start, t_g, wait_ms)

    def reserve(self, probe: Probe) -> tuple[int, ...]:
        """Mark `probe`'s slots busy; returns one slot id per slot, in order.

        Raises ValueError (and changes nothing) if a slot overlaps a reservation, i.e. the probe
        is stale.
        """
        for slot in probe.slots:
            if slot.end_ms > slot.start_ms and self._overlaps(
                slot.resource, slot.start_ms, slot.end_ms
            ):
                raise ValueError(f"slot {slot} overlaps a reservation: the probe is stale")
        ids = []
        for slot in probe.slots:
            if slot.end_ms > slot.start_ms:  # a slot of no length takes no time: not kept
                r = slot.resource
                i = bisect_left(self._starts[r], slot.start_ms)
                self._insert(r, i, slot.start_ms, slot.end_ms, self._next_id)
            ids.append(self._next_id)
            self._next_id += 1
        return tuple(ids)

    def _overlaps(self, r: int, start_ms: float, end_ms: float) -> bool:
        starts, ends = self._starts[r], self._ends[r]
        i = bisect_left(starts, start_ms)
        if i > 0 and ends[i - 1] > start_ms + _EPS_MS:
            return True
        return i < len(starts) and starts[i] < end_ms - _EPS_MS

    def _insert(self, r: int, i: int, start_ms: float, end_ms: float, slot_id: int) -> None:
        self._starts[r].insert(i, start_ms)
        self._ends[r].insert(i, end_ms)
        self._ids[r].insert(i, slot_id)
        self._where[slot_id] = (r, start_ms)

    def _index(self, slot_id: int) -> tuple[int, int]:
        r, start = self._where[slot_id]
        i = bisect_left(self._starts[r], start)
        assert self._ids[r][i] == slot_id
        return r, i

    def started(self, slot_id: int, start_ms: float, duration_ms: float) -> None:
        """Feedback: the slot really began at `start_ms` and is expected to take `duration_ms`.

        Called when its resource is idle and every slot that ran on it before has finished. The
        slot becomes the first not-yet-begun slot of its resource; later overlapping slots move.
        A slot of no length (not kept) is ignored.
        """
        if slot_id not in self._where:
            return
        r, i = self._index(slot_id)
        k = self._started[r]
        if i < k:
            raise ValueError(f"slot {slot_id} already began")
        if k > 0 and self._ends[r][k - 1] > start_ms + _EPS_MS:
            raise ValueError(f"slot {slot_id} begins before the slot ahead of it ends")
        del self._starts[r][i], self._ends[r][i], self._ids[r][i]
        self._insert(r, k, start_ms, start_ms + duration_ms, slot_id)
        self._started[r] = k + 1
        self._push_after(r, k)

    def finished(self, slot_id: int, end_ms: float) -> None:
        """Feedback: the slot (already `started`) really ended at `end_ms`; it is forgotten
        together with every finished slot before it. A slot of no length is ignored."""
        if slot_id not in self._where:
            return
        r, i = self._index(slot_id)
        if i >= self._started[r]:
            raise ValueError(f"slot {slot_id} finished before it began")
        self._ends[r][i] = end_ms
        self._push_after(r, i)
        self._finished.add(slot_id)
        drop = 0
        while drop < self._started[r] and self._ids[r][drop] in self._finished:
            self._finished.discard(self._ids[r][drop])
            del self._where[self._ids[r][drop]]
            drop += 1
        if drop:
            del self._starts[r][:drop], self._ends[r][:drop], self._ids[r][:drop]
            self._started[r] -= drop

    def _push_after(self, r: int, i: int) -> None:
        starts, ends, ids = self._starts[r], self._ends[r], self._ids[r]
        for j in range(i + 1, len(starts)):
            if starts[j] >= ends[j - 1]:
                break
            shift = ends[j - 1] - starts[j]
            starts[j] += shift
            ends[j] += shift
            self._where[ids[j]] = (r, starts[j])

"""The server's runtime: requests in, the scheduler's plan executed, answers out (paper 003, 5.1).

One asyncio loop owns the engine (scheduler state and plans) and every request's future; one
executor thread runs actions (torch releases the GIL), the thread the models were loaded on
(`layerexec.torch_thread`: torch work on a second thread slows every forward). Inputs are decoded
by a small pool when torch's intra-op threads leave cores free; when they take every core, inputs
are decoded on the executor thread between steps instead: a decode beside a forward stalls each of
torch's parallel ops until the core it took comes back (measured here: with one of 2 cores busy, a
2-thread resnet18 forward took 25x as long), while in turn a decode costs just its own time. The
runner repeats the runtime step: read the clock once, run the next piece of the newest plan up to
the next layer-group boundary on the executor thread, and re-plan while it runs (paper 003 section
4.1: planning concurrent with execution); hand back how far it got. Between two steps the loop
does only what the next step needs (the engine takes back the last one, the next is handed out);
answers, metrics, calibration and the re-plan wait until the executor thread has started it, as
each step costs the device the time it waits for the loop (`step_gap_ms`; measured here with
the demo's models: 1.0 ms a step of 5.5 ms with the bookkeeping first, 0.5 ms after). An arrival
also re-plans at once on the loop; if a new plan no longer starts with the running step, the step
is cancelled at its next stage boundary (exit check). When the plan has no valid next piece, plan
first.

Profiles are measured on an idle machine; a serving machine also decodes, parses and plans, so
its stages run slower, and not all by the same factor. The runtime compares every completed
step's measured time (read on the executor thread) with its stages' profiled times, keeps a factor
per stage (EWMAs, `server.calibration`) and, when one drifts by more than 15% from the factor the
plans carry, plans with each stage's profile rescaled by its own factor (`stage_scales` in
/v1/status; `time_scale` is their time-weighted mean). Decodes on
the executor thread are device time per request, not per stage: their measured mean (EWMA,
`decode_ms`, measured wherever decodes run) is added per sample to each model's first stage
instead. Deadlines are judged
against what this machine really does, and count from when a request was received, before its
decode (which may wait behind a step).

Every accepted request is answered exactly once: with its result, as dropped (by the plan, with
the reason), or with an error if its action failed. A client that goes away is forgotten: its
request leaves the queue and its tensors are freed. Should planning or the runner itself fail (a
fault of the server's), every queued request is answered with that error and the server refuses
new ones, saying why, instead of leaving them waiting.

Admission. Under a policy that drops the requests it would finish late (`dp-tardy`), a request
is answered dropped on arrival, before its decode, when the work queued ahead of it, at a
saturated server's cost per request, would not leave it done within its deadline, and, while
the queue is overloaded (since one of its requests was dropped, until an arrival finds it
empty), within ADMISSION_SHARE of it (`scheduler.admission`). Past capacity the queue otherwise
grows to the deadline's edge, and there a plan's prediction for a request at the back is not
its fate: one admitted at a predicted 601 ms of a 1000 ms deadline was dropped 371 ms later,
predicted 8 ms late (mobilenet_v2 at 125 req/s on 2 replicas). Those requests were decoded and
planned for nothing, and the answers that made it left little slack, so the client's clock,
which also counts the way in, saw many as late. With the share always on, against the commit
before it (`bench/server_ab.py`, 2 replicas, 4 pairs each, ahead in 4 of 4 on mobilenet_v2):
mobilenet_v2 at 1000 ms and 135 req/s +0.095 on time (client timeouts from 63-134 a run to 0-5,
planning from 10-13% of a core to 2-3%), at 1000 ms and 125 req/s +0.101, at 300 ms and 120
req/s +0.179. But it cost where the queue passes the share only for a moment and then drains
in time: googlenet at 300 ms and 33 req/s -0.021, and under the Azure trace at 1000 ms and 38
req/s -0.086 against admission off (bench/results/peers-log.md, sessions 75-76). Holding the
share for an overloaded queue only, against the share always on (session 77): googlenet under
the trace at 1000 ms and 70 req/s +0.096 (ahead in 4 of 4, 0-1 dropped a run against 14-24);
mobilenet_v2 past capacity, where the share holds from the first seconds on, at 1000 ms and 340
req/s -0.016 and at 300 ms and 300 req/s +0.016 (each ahead in 2 of 4).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from layerexec.executor import Executor, Progress, ShapeError
from layerexec.torch_thread import TorchThread
from layerexec.zoo import ModelSpec, StagedModel
from scheduler.admission import ADMISSION_SHARE, Admission
from scheduler.deployment import Deployment
from scheduler.engine import Dropped, Engine
from scheduler.errors import InputError
from scheduler.policies import make_policy
from scheduler.policies.common import QUEUE_FULL_AHEAD
from scheduler.profile import scaled_stages, with_entry_cost
from scheduler.state import SchedulerState
from scheduler.types import Action, Request, Step
from server.calibration import StageCalibration, ewma
from server.errors import BadRequest
from server.inputs import feature_tensor, image_tensor
from server.metrics import Metrics
from server.results import describe, is_finite
from server.step_log import StepLog
from server.wire import InferRequest, fresh_id

Clock = Callable[[], float]  # milliseconds, monotonic
SWITCH_INTERVAL_S = 0.0005
CALIBRATION_WEIGHT = 0.05  # EWMA weight of each step's measured / profiled time
CALIBRATION_EVERY = 25  # steps between checks (after the first CALIBRATION_EVERY, each checked)
CALIBRATION_DRIFT = 0.15  # rescale when the factor moved by more than this
NOT_FINITE = (
    "the model's output is not finite (NaN or infinity): the input's values are outside the range "
    "the model takes"
)


class Overloaded(BadRequest):
    """The queue is full: 503, try again after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(503, message)
        self.retry_after_s = retry_after_s


@dataclass
class Pending:
    request: Request
    future: asyncio.Future[dict[str, Any]]
    first_run_ms: float | None = None
    exec_ms: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)
    raw: bool = False


def monotonic_ms() -> float:
    return time.monotonic() * 1000.0


def spare_cores(torch_threads: int, cores: int | None = None, most: int = 2) -> int:
    """Decode threads for a server whose torch uses `torch_threads` of `cores` (default: this
    machine's): the cores torch leaves free, at most `most`; 0 (decode on the executor thread)
    when torch takes them all."""
    total = cores if cores is not None else (os.cpu_count() or 1)
    return max(0, min(most, total - torch_threads))


class Runtime:
    def __init__(
        self,
        deployment: Deployment,
        models: Mapping[str, StagedModel],
        policy: str = "dp-tardy",
        clock: Clock = monotonic_ms,
        max_queued: int = 1000,
        memory_bytes: float | None = None,
        channels_last: bool = True,
        estimate_ttl_ms: float = 250.0,
        calibrate: bool = True,
        decode_threads: int | None = None,
        torch_thread: TorchThread | None = None,
        step_log: StepLog | None = None,
        metrics: Metrics | None = None,
        replica: int | None = None,
        admission_share: float | None = ADMISSION_SHARE,
    ) -> None:
        """`torch_thread`: the thread the models were loaded on, to run the steps on (and this
        constructor on, as it moves the weights: `layerexec.torch_thread`); a new one if None.
        `step_log`: where every step it runs is written (`server.step_log`); closed by `stop`.
        `metrics` and `replica`: the counters it shares with the other replicas of a server, and
        which of them it is (`server.replicas`; the step log says so on every line).
        `admission_share`: see the module docstring, "Admission" (None: every request is
        decoded and left to the plans)."""
        self.deployment = deployment
        self.base_profiles = dict(deployment.profiles)
        self.calibrate = calibrate
        self.time_scale = 1.0
        self.decode_ms: float | None = None  # EWMA of decodes (on whichever thread)
        self.step_gap_ms: float | None = None  # EWMA of the hand-offs between steps (_run)
        self._entry_ms = 0.0  # the decode_ms the plans' profiles carry
        self._calibration = StageCalibration(CALIBRATION_WEIGHT)
        # the factor per stage that the plans' profiles carry, per model
        self.stage_scales = {m: (1.0,) * p.num_stages for m, p in self.base_profiles.items()}
        self._steps_calibrated = 0
        self.models = dict(models)
        self.executor = Executor(deployment, models, channels_last=channels_last)
        self.memory_bytes = memory_bytes  # activation budget (stacking stays within it)
        self.engine = Engine(
            deployment, make_policy(policy, memory_bytes=memory_bytes), timer=time.perf_counter
        )
        self.policy_name = policy
        self.clock = clock
        self.max_queued = max_queued
        self.admission = None if admission_share is None else Admission(admission_share)
        self.estimate_ttl_ms = estimate_ttl_ms
        self.metrics = metrics or Metrics()
        self.replica = replica
        self.pending: dict[str, Pending] = {}
        self.accepting = True
        self.failure: str | None = None  # why the runner stopped, if it did (see _fail)
        self.started_ms = clock()
        self.step_log = step_log
        self._ids = itertools.count()
        self._kick: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._cancel: threading.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.torch_thread = torch_thread or TorchThread()
        self._exec_pool = self.torch_thread.pool
        self._side_pool = ThreadPoolExecutor(1, thread_name_prefix="layerbatch-stack")
        # its thread starts now, not later from the loop's thread, which may yield (torch_thread)
        self._side_pool.submit(int).result()
        self._side_task: asyncio.Task[None] | None = None
        if decode_threads is None:
            decode_threads = spare_cores(torch.get_num_threads())
        self.decode_threads = decode_threads
        self._decode_pool = (
            ThreadPoolExecutor(decode_threads, thread_name_prefix="layerbatch-decode")
            if decode_threads > 0
            else self._exec_pool  # in turn with the steps (module docstring)
        )
        self._estimates: dict[tuple[str, int], tuple[float, float | None]] = {}
        self._replan_queued = False
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_ms: float | None = None  # the deadline it is set for
        self._decoding: set[str] = set()  # ids of the requests being decoded (admitted)
        self._plans_seen = 0

    # --- life cycle -------------------------------------------------------------------------
    async def start(self) -> None:
        # Planning on the loop thread and stage dispatch on the executor thread share the GIL;
        # with the default 5 ms switch interval a plan can stall the executor between two torch
        # ops for that long. 0.5 ms keeps the executor's hand-offs short.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._kick = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task = asyncio.create_task(self._run(), name="layerbatch-runner")
        self._task.add_done_callback(self._runner_done)

    async def drain(self) -> None:
        """Stop accepting; return once every accepted request has been answered."""
        self.accepting = False
        while self.pending:
            self._wake()
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for rid in list(self.pending):
            self._answer(rid, "dropped", reason="the server stopped")
        self._exec_pool.shutdown(wait=True)
        self._side_pool.shutdown(wait=True)
        if self._decode_pool is not self._exec_pool:
            self._decode_pool.shutdown(wait=False)
        self.executor.close()
        if self.step_log is not None:
            self.step_log.close()

    @property
    def ready(self) -> bool:
        """Accepting requests, its runner running."""
        return self.accepting and self._task is not None and not self._task.done()

    # --- what apps there are ---------------------------------------------------------------
    def app_lengths(self) -> dict[str, int]:
        return {a: self.deployment.app_length(a) for a in self.deployment.apps}

    def first_spec(self, app: str) -> ModelSpec:
        return self.models[self.deployment.apps[app].models[0]].spec

    def set_policy(self, name: str) -> None:
        self.engine.set_policy(make_policy(name, memory_bytes=self.memory_bytes))
        self.policy_name = name
        self._estimates.clear()
        self._wake()

    # --- requests ---------------------------------------------------------------------------
    async def submit(self, req: InferRequest, raw: bool = False) -> dict[str, Any]:
        """Admit, wait for the answer, return it. Raises BadRequest for a request it refuses.
        With `raw`, the answer also carries the last model's output itself (`raw_output`)."""
        if not self.accepting:
            raise BadRequest(
                503, self.failure or "the server is shutting down and accepts no new requests"
            )
        if len(self.pending) + len(self._decoding) >= self.max_queued:
            raise Overloaded(
                f"the queue is full ({self.max_queued} requests); try again shortly", 1
            )
        rid = req.request_id or fresh_id(self._ids, self._holds)
        if self._holds(rid):
            raise BadRequest(409, f"request_id: {rid!r} is already in use by a queued request")
        loop = asyncio.get_running_loop()
        received_ms = self.clock()  # the deadline counts from here, not from the decode's end
        request = Request(rid, req.app, req.position, received_ms,
                          received_ms + req.deadline_ms, req.client_id or "")  # fmt: skip
        if self.admission is not None and self.admission.turns_away(  # module doc, "Admission"
            self.engine.state, self.policy_name, request, received_ms, len(self._decoding)
        ):
            return self._turn_away(request, raw)
        self._decoding.add(rid)  # holds a place in the queue (and its id) while it decodes
        try:
            tensor, took_ms = await loop.run_in_executor(self._decode_pool, self._decode_timed, req)
            self._observe_decode(took_ms)
        except asyncio.CancelledError:  # its client left while it was decoded: counted as such
            self.metrics.answer(req.app, "cancelled", None, False)
            raise
        finally:
            self._decoding.discard(rid)
        if self.failure is not None:  # the runner failed while this request was decoded
            raise BadRequest(503, self.failure)
        try:
            self.executor.admit(rid, req.app, req.position, tensor)
        except ShapeError as exc:
            raise BadRequest(422, f"payload: {exc}") from None
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.pending[rid] = Pending(request, future, raw=raw)
        try:
            self.engine.add(request)
        except InputError as exc:
            self.pending.pop(rid)
            self.executor.drop([rid])
            raise BadRequest(422, str(exc)) from None
        self._replan_soon()
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self.forget(rid)
            raise

    def _holds(self, rid: str) -> bool:
        """Whether a request with this id is queued or being decoded here."""
        return rid in self.pending or rid in self._decoding

    def _turn_away(self, r: Request, raw: bool) -> dict[str, Any]:
        """Answer `r` as dropped (QUEUE_FULL_AHEAD) at once, before its decode."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[r.id] = Pending(r, future, raw=raw)
        self._answer_drops([Dropped(r, QUEUE_FULL_AHEAD, r.arrival_ms)])
        return future.result()

    def _arm_deadline_timer(self) -> None:
        """Wake at the earliest deadline of a queued request, so that a request whose deadline
        passes while it waits is answered then, not when the next batch forms. A timer already
        set for that deadline is kept."""
        running = set(self.engine.running.action.request_ids) if self.engine.running else set()
        first = min((r.deadline_ms for r in self.engine.state if r.id not in running), default=None)
        if self._deadline_timer is not None:
            if first == self._deadline_ms:
                return
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._deadline_ms = first
        if first is not None:
            delay_s = max(0.0, (first - self.clock()) / 1000.0) + 0.0005
            loop = asyncio.get_running_loop()
            self._deadline_timer = loop.call_later(delay_s, self._deadline_passed)

    def _deadline_passed(self) -> None:
        self._deadline_timer = None
        self._replan_now()

    def _replan_soon(self) -> None:
        """Re-plan on the loop's next turn, once for whatever asks before then (arrivals decoded
        in the same turn share one plan)."""
        if not self._replan_queued:
            self._replan_queued = True
            asyncio.get_running_loop().call_soon(self._replan_now)

    def _replan_after_start(self) -> None:
        """The re-plan once a continued step has started, unless a plan was already made for
        this state since it started (an arrival decoded just before it, on the executor thread)."""
        if not self.engine.plan_is_current():
            self._replan_soon()

    def _replan_now(self) -> None:
        """Re-plan now (after arrivals, at a queued request's deadline, or while a continued
        step runs), the device perhaps busy: answer what the plan drops, and stop the running
        step at its next stage boundary if the plan no longer starts with it."""
        self._replan_queued = False
        try:
            self._answer_drops(self.engine.replan(self.clock()))
        except Exception as exc:  # a fault of the scheduler's, not of a request
            self._fail(exc)
            return
        self._record_plans()
        self._arm_deadline_timer()
        if (
            self.engine.running is not None
            and self._cancel is not None
            and self.engine.wants_preemption()
        ):
            self._cancel.set()
        self._start_beside()
        self._wake()

    def _runner_done(self, task: asyncio.Task[None]) -> None:
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """The runner or a plan raised: a fault of the server's, not of any request. It says so
        on stderr and in /v1/status (`failure`), answers every queued request with that error,
        refuses new ones (503, /readyz 503) and stays up for an operator to see why; nothing
        waits for an answer that will never come."""
        if self.failure is None:
            self.failure = (
                "the server's scheduler failed and it serves no more requests "
                f"({type(exc).__name__}: {exc}); restart it"
            )
            traceback.print_exception(exc)
        self.accepting = False
        if self._task is not None and not self._task.done():
            self._task.cancel()
        for rid in list(self.pending):
            self._answer(rid, "error", reason=self.failure)

    def forget(self, rid: str) -> None:
        """The client went away: the request leaves the queue, its tensors are freed."""
        p = self.pending.pop(rid, None)
        if p is None:
            return
        self.engine.remove([rid])
        self.executor.drop([rid])
        self.metrics.answer(p.request.app, "cancelled", None, False)
        if not p.future.done():
            p.future.cancel()

    def _decode_timed(self, req: InferRequest) -> tuple[torch.Tensor, float]:
        started = self.clock()
        tensor = self._decode(req)
        return tensor, self.clock() - started

    def _observe_decode(self, took_ms: float) -> None:
        """Fold one decode's time into `decode_ms` (EWMA) and the busy time."""
        self.decode_ms = ewma(self.decode_ms, took_ms, CALIBRATION_WEIGHT)
        self.metrics.busy_ms["decode"] += took_ms

    def _decode(self, req: InferRequest) -> torch.Tensor:
        if req.jpeg is not None:
            return image_tensor(req.jpeg, self.first_spec(req.app))
        if req.tensor is not None:
            tensor: torch.Tensor = req.tensor  # shape checked at admission
            return tensor
        assert req.features is not None
        model, stage = self.deployment.locate(req.app, req.position)
        return feature_tensor(req.features, self.models[model].in_shapes[stage])

    # --- estimates ---------------------------------------------------------------------------
    def estimate_ms(self, app: str, position: int = 0) -> float | None:
        """The scheduler's completion time for a request of `app` entering now at `position`
        (None if the policy would not serve it): a plan with it added, cached for a few ms."""
        now = self.clock()
        hit = self._estimates.get((app, position))
        if hit is not None and now - hit[0] <= self.estimate_ttl_ms:
            return hit[1]
        probe = SchedulerState(self.deployment, self.engine.state.requests())
        probe.running = self.engine.state.running  # counted from its start, as plans are
        pid = "__estimate__"
        probe.add(Request(pid, app, position, now))
        plan = self.engine.policy.plan(probe, now)
        value = plan.completion_ms.get(pid)
        result = None if value is None else round(value - now, 3)
        self._estimates[(app, position)] = (now, result)
        return result

    # --- the runtime step --------------------------------------------------------------------
    def _wake(self) -> None:
        if self._kick is not None:
            self._kick.set()

    async def _run(self) -> None:
        """Start steps while the plan has one. The device waits for the loop as little as it
        can: the engine takes back what a step did and the next step is handed to the executor
        thread first; the rest (answers, metrics, calibration) and the re-plan that follows a
        continued step run on the loop once that thread has started the next step (`_Later`),
        so they neither delay the hand-off nor hold the GIL the thread needs to start it. That
        re-plan is skipped when a request decoded just before the step (on the executor thread)
        has already been planned since it started (`Engine.plan_is_current`)."""
        assert self._kick is not None and self._idle is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._kick.wait()
            self._kick.clear()
            later, after_ms = _Later(), None
            while self.engine.running is None:
                now = self.clock()
                # the plan's next piece starts at once; the re-plan runs while it executes
                step = self.engine.continue_step(now)
                if step is not None:
                    later.add(self._replan_after_start)
                else:
                    step, wake, drops = self.engine.next_step(now)
                    self._record_plans()
                    self._answer_drops(drops)
                    self._arm_deadline_timer()
                    self._start_beside()
                if step is None:
                    later()
                    if wake is not None:
                        loop.call_later(max(0.0, (wake - now) / 1000.0), self._wake)
                    break
                self._idle.clear()
                later, after_ms = await self._execute(step, loop, later, after_ms)
                self._idle.set()
            later()

    async def _execute(
        self,
        step: Step,
        loop: asyncio.AbstractEventLoop,
        at_start: _Later,
        after_ms: float | None,
    ) -> tuple[_Later, float | None]:
        """Run `step` on the executor thread, `at_start` on the loop once it has started; the
        engine takes back what it did. `after_ms`: when the step before it ended, if this one
        was ready at once (the gap between them is the hand-off, `step_gap_ms`). Returns what
        is left to do for it (see `_run`) and when it ended (None if it failed)."""
        action = step.action
        cancel = threading.Event()
        self._cancel = cancel
        try:
            started, ended, progress = await loop.run_in_executor(
                self._exec_pool, self._run_timed, action, cancel.is_set, at_start, loop
            )
        except Exception as exc:  # one action failed: fail its requests, keep serving the rest
            at_start()
            ids = list(action.request_ids)
            self.engine.remove(ids)
            self.engine.finish(0)
            self.executor.drop(ids)
            k0, k1 = action.stages
            for rid in ids:
                self._answer(
                    rid,
                    "error",
                    reason=f"running {action.model} stages {k0}..{k1 - 1} failed: {exc}",
                )
            return _Later(), None
        finally:
            self._cancel = None
        finished = self.engine.finish(progress.stages_done)
        gap_ms = None if after_ms is None else started - after_ms
        planned_ms = step.planned_ms(progress.stages_done)
        return _Later(
            lambda: self._settle(progress, started, ended, finished, gap_ms, planned_ms)
        ), ended

    def _settle(
        self,
        progress: Progress,
        started: float,
        ended: float,
        finished: list[Request],
        gap_ms: float | None,
        planned_ms: float,
    ) -> None:
        """The bookkeeping of a step that ran: the hand-off before it, when its requests first
        ran, the measured against the planned time (calibration), metrics and answers;
        `planned_ms`, what its plan took the stages it ran to cost, goes to the step log."""
        if gap_ms is not None:
            self.metrics.step_gap.observe(gap_ms)
            self.step_gap_ms = ewma(self.step_gap_ms, gap_ms, CALIBRATION_WEIGHT)
        action = progress.action
        for rid in action.request_ids:
            p = self.pending.get(rid)
            if p is not None and p.first_run_ms is None:
                p.first_run_ms = started
        done = progress.stages_done
        if progress.cancelled:
            self.metrics.preempted += 1
        elif done and progress.batch_size:  # the stages' time against the base profile (no decodes)
            model, k0, b = action.model, action.stages[0], progress.batch_size
            base = self.base_profiles[model]
            profiled = [base.latency_ms(k, b) for k in range(k0, k0 + done)]
            scales = self.stage_scales[model][k0 : k0 + done]
            planned = sum(p * f for p, f in zip(profiled, scales, strict=True))
            self.metrics.step_ratio.observe((ended - started) / max(planned, 1e-6))
            self._calibrate(model, k0, profiled, ended - started)
        self._account(progress, "step", started, ended - started, planned_ms, finished)

    def _run_timed(
        self,
        action: Action,
        cancel: Callable[[], bool],
        at_start: _Later | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> tuple[float, float, Progress]:
        """`executor.run` on the executor thread, with the clock read there when it starts and
        ends: the step's own time, without the decodes queued before it on that thread (those
        are per request, not per stage: counting them would inflate the calibration) or the
        hand-back to the loop. `at_start` is handed to the loop as the step starts."""
        started = self.clock()
        if at_start and loop is not None:
            loop.call_soon_threadsafe(at_start)
        progress = self.executor.run(action, cancel, skip_dropped=True)
        return started, self.clock(), progress

    def _start_beside(self) -> None:
        """Start the newest plan's stacked action (`Plan.beside`) on the second lane, if it has
        one and that lane is free: it runs on its own thread beside the running step."""
        step = self.engine.next_beside(self.clock())
        if step is None:
            return
        started = self.clock()
        for rid in step.action.request_ids:
            p = self.pending.get(rid)
            if p is not None and p.first_run_ms is None:
                p.first_run_ms = started
        self._side_task = asyncio.get_running_loop().create_task(self._execute_beside(step))

    async def _execute_beside(self, step: Step) -> None:
        action = step.action
        loop = asyncio.get_running_loop()
        started = self.clock()
        try:
            progress = await loop.run_in_executor(
                self._side_pool, self.executor.run_on_stream, action, None, True
            )
        except Exception as exc:  # fail this action's requests, keep serving the rest
            self.engine.finish_beside(0)
            ids = list(action.request_ids)
            self.engine.remove(ids)
            self.executor.drop(ids)
            for rid in ids:
                self._answer(rid, "error", reason=f"running {action.model} stacked failed: {exc}")
            self._wake()
            return
        ended = self.clock()
        done = progress.stages_done
        self.metrics.stacked += 1
        self._account(
            progress, "stacked", started, ended - started, step.planned_ms(done),
            self.engine.finish_beside(done),
        )  # fmt: skip
        self._replan_now()

    def _account(
        self,
        progress: Progress,
        lane: str,
        started_ms: float,
        took_ms: float,
        planned_ms: float,
        finished: list[Request],
    ) -> None:
        """Metrics (the busy time of `lane`: "step" or "stacked"), the step log and per-request
        times of an action that ran on `lane` (`server.step_log`); answer the requests it
        finished (`finished`: what the engine says finished their app)."""
        action, done, batch = progress.action, progress.stages_done, progress.batch_size
        self.metrics.busy_ms[lane] += took_ms  # preempted steps too
        if self.step_log is not None:
            self.step_log.write(
                lane, started_ms - self.started_ms, action.model, action.stages[0], done, batch,
                took_ms, planned_ms, progress.cancelled, self.replica,
            )  # fmt: skip
        if batch:
            self.metrics.ran(action.model, range(action.stages[0], action.stages[0] + done), batch)
        for rid in action.request_ids:
            p = self.pending.get(rid)
            if p is not None and done:
                p.exec_ms += took_ms
                p.batch_sizes.append(batch)
        for r in finished:
            if r.id in progress.finished:
                self._answer(r.id, "ok", output=progress.finished[r.id])

    def _calibrate(
        self, model: str, first_stage: int, profiled_ms: list[float], measured_ms: float
    ) -> None:
        """Fold in one step's measured time and its stages' base-profile times
        (`server.calibration`); after each of the first CALIBRATION_EVERY steps (a new server
        learns fast how this machine runs), then every CALIBRATION_EVERY steps, rescale the plans'
        profiles when a stage's factor or the decode time has drifted from the one they carry."""
        if not self.calibrate:
            return
        self._calibration.observe(model, first_stage, profiled_ms, measured_ms)
        self._steps_calibrated += 1
        n = self._steps_calibrated
        if n > CALIBRATION_EVERY and n % CALIBRATION_EVERY:
            return
        scales = {
            m: self._calibration.factors(m, p.num_stages) for m, p in self.base_profiles.items()
        }
        drifted = any(
            abs(new / old - 1.0) > CALIBRATION_DRIFT
            for m, fs in scales.items()
            for new, old in zip(fs, self.stage_scales[m], strict=True)
        )
        # decodes are device time only on the executor thread (module doc)
        entry_ms = (self.decode_ms or 0.0) if self.decode_threads == 0 else 0.0
        if drifted or abs(entry_ms - self._entry_ms) > CALIBRATION_DRIFT * max(self._entry_ms, 1.0):
            d = self.deployment
            profiles = [with_entry_cost(scaled_stages(p, scales[m]), entry_ms)
                        for m, p in self.base_profiles.items()]  # fmt: skip
            self.deployment = d.with_profiles(profiles)
            self.engine.rebase(self.deployment)
            self.stage_scales, self._entry_ms = scales, entry_ms
            self.time_scale = self._calibration.overall()
            self._estimates.clear()

    def _record_plans(self) -> None:
        for us in self.engine.plan_us[self._plans_seen :]:
            self.metrics.plan.observe(us)
        self._plans_seen = len(self.engine.plan_us)

    def _answer_drops(self, drops: list[Dropped]) -> None:
        if drops and self.admission is not None:
            self.admission.dropped()
        for d in drops:
            r = d.request
            self.executor.drop([r.id])
            self.metrics.dropped[d.reason] += 1
            if self.step_log is not None:
                late_by = None if d.predicted_ms is None else d.predicted_ms - r.deadline_ms
                self.step_log.drop(
                    d.at_ms - self.started_ms, r.id, r.app, d.reason, d.at_ms - r.arrival_ms,
                    r.deadline_ms - d.at_ms, late_by, self.replica,
                )  # fmt: skip
            self._answer(r.id, "dropped", reason=d.reason)

    def _answer(self, rid: str, status: str, output: Any = None, reason: str | None = None) -> None:
        p = self.pending.pop(rid, None)
        if p is None or p.future.done():
            return
        code = None
        if status == "ok" and not is_finite(output):
            status, reason, output, code = "error", NOT_FINITE, None, 422
        now = self.clock()
        r = p.request
        total = now - r.arrival_ms
        on_time = status == "ok" and now <= r.deadline_ms
        self.metrics.answer(r.app, status, total if status == "ok" else None, on_time)
        if status == "ok" and self.step_log is not None:
            self.step_log.answer(
                now - self.started_ms, rid, r.app, total, r.deadline_ms - now, self.replica
            )
        doc: dict[str, Any] = {"request_id": rid, "status": status}
        if reason is not None:
            doc["reason"] = reason
        if code is not None:
            doc["code"] = code
        if status == "ok":
            last = self.deployment.apps[r.app].models[-1]
            doc["result"] = describe(self.models[last].spec, output)
            if p.raw:
                doc["raw_output"] = output
        queue = (p.first_run_ms if p.first_run_ms is not None else now) - r.arrival_ms
        doc["timing"] = {
            "received_ms": round(r.arrival_ms - self.started_ms, 3),
            "queue_ms": round(queue, 3),
            "exec_ms": round(p.exec_ms, 3),
            "total_ms": round(total, 3),
        }
        doc["on_time"] = on_time
        doc["batch_sizes"] = p.batch_sizes
        doc["estimate_ms"] = None if self.failure else self.estimate_ms(r.app)
        p.future.set_result(doc)

    # --- status ------------------------------------------------------------------------------
    def queue_by_stage(self) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        for r in self.engine.state:
            key = self.deployment.locate(r.app, r.position)
            out[key] = out.get(key, 0) + 1
        return out

    def status(self) -> dict[str, Any]:
        running = self.engine.running
        return {
            "policy": self.policy_name,
            "accepting": self.accepting,
            "queued": len(self.pending),
            "queue": {f"{m}[{k}]": n for (m, k), n in sorted(self.queue_by_stage().items())},
            "running": None
            if running is None
            else {
                "model": running.action.model,
                "stages": list(running.action.stages),
                "batch": running.action.batch_size,
            },
            "counters": {
                "answered": {f"{a}/{s}": n for (a, s), n in sorted(self.metrics.answered.items())},
                "on_time": dict(self.metrics.on_time),
                "dropped": dict(self.metrics.dropped),
                "preempted": self.metrics.preempted,
                "stacked": self.metrics.stacked,
            },
            "store_bytes": self.executor.store.nbytes(),
            "time_scale": round(self.time_scale, 3),
            "stage_scales": {m: [round(f, 3) for f in fs] for m, fs in self.stage_scales.items()},
            "decode_threads": self.decode_threads,
            "decode_ms": None if self.decode_ms is None else round(self.decode_ms, 3),
            "step_gap_ms": None if self.step_gap_ms is None else round(self.step_gap_ms, 3),
            "layer_groups": {m: len(self.deployment.group_bounds(m)) for m in self.base_profiles},
            # the part of a deadline the door admits within now (None: admission off)
            "admission_share": None
            if self.admission is None
            else round(self.admission.share_now(), 3),
            "failure": self.failure,
        }


class _Later:
    """Callables to run once, in order, on the event loop: calling it runs those not yet run
    (so a copy handed to the loop and a direct call never run one twice)."""

    def __init__(self, *fns: Callable[[], None]) -> None:
        self._fns = list(fns)

    def add(self, fn: Callable[[], None]) -> None:
        self._fns.append(fn)

    def __bool__(self) -> bool:
        return bool(self._fns)

    def __call__(self) -> None:
        fns, self._fns = self._fns, []
        for fn in fns:
            fn()

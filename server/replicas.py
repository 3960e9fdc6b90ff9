"""Several runtimes on one machine behind one API (`layerbatch serve --replicas N`).

Each replica is a whole `Runtime`: its own executor thread with its own torch threads, its own
engine (queue, plans, calibration) and its own decodes, on the models' shared weights. A request
is dispatched to one replica when it arrives (`scheduler.dispatch`: the least work left) and is
planned, batched, run and answered there; requests in different replicas never batch together.
What the API sees is one server: request ids are unique across replicas (ids are given here when
a request has none), the queue bound counts every replica's requests, the counters are shared
(`Metrics`; busy time is summed over the replicas), and /v1/status lists each replica beside the
totals. Should one replica's scheduler fail, the server refuses new requests, as one runtime does.

Why: on a CPU, torch's intra-op threads wait for each other at the end of every parallel op, so
anything else that takes one of their cores (the event loop, a decode, the load beside) stalls
all of them; one-thread replicas have no such barrier, and run small batches more efficiently
too (README, "Replicas").
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections import Counter
from collections.abc import Sequence
from typing import Any

from layerexec.zoo import ModelSpec, StagedModel
from scheduler.deployment import Deployment
from scheduler.dispatch import choose_replica
from server.errors import BadRequest
from server.metrics import Metrics
from server.runtime import Overloaded, Runtime
from server.wire import InferRequest, fresh_id


class Replicas:
    """`runtimes` (sharing one `Metrics`) behind the interface the app uses of a `Runtime`."""

    def __init__(self, runtimes: Sequence[Runtime], max_queued: int = 1000) -> None:
        if len(runtimes) < 2:
            raise ValueError(f"runtimes: expected at least 2, got {len(runtimes)}")
        if any(r.metrics is not runtimes[0].metrics for r in runtimes):
            raise ValueError("runtimes: expected them to share one Metrics")
        self.runtimes = list(runtimes)
        self.max_queued = max_queued
        self._ids = itertools.count()
        # request id -> (replica, its work at dispatch): what each replica holds, until answered
        self._holding: dict[str, tuple[int, float]] = {}
        self._work_ms = [0.0] * len(runtimes)

    # --- what the app reads of a runtime -------------------------------------------------------
    @property
    def deployment(self) -> Deployment:
        return self.runtimes[0].deployment

    @property
    def models(self) -> dict[str, StagedModel]:
        return self.runtimes[0].models

    @property
    def metrics(self) -> Metrics:
        return self.runtimes[0].metrics

    @property
    def policy_name(self) -> str:
        return self.runtimes[0].policy_name

    @property
    def accepting(self) -> bool:
        return all(r.accepting for r in self.runtimes)

    @property
    def ready(self) -> bool:
        return all(r.ready for r in self.runtimes)

    def app_lengths(self) -> dict[str, int]:
        return self.runtimes[0].app_lengths()

    def first_spec(self, app: str) -> ModelSpec:
        return self.runtimes[0].first_spec(app)

    # --- life cycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        for r in self.runtimes:
            await r.start()

    async def drain(self) -> None:
        """Stop accepting; return once every replica has answered what it accepted."""
        await asyncio.gather(*(r.drain() for r in self.runtimes))

    async def stop(self) -> None:
        for r in self.runtimes:
            await r.stop()

    def set_policy(self, name: str) -> None:
        for r in self.runtimes:
            r.set_policy(name)

    # --- requests -------------------------------------------------------------------------------
    async def submit(self, req: InferRequest, raw: bool = False) -> dict[str, Any]:
        """`Runtime.submit` on the replica with the least work left (`scheduler.dispatch`)."""
        if not self.accepting:
            failure = next((r.failure for r in self.runtimes if r.failure), None)
            raise BadRequest(
                503, failure or "the server is shutting down and accepts no new requests"
            )
        if len(self._holding) >= self.max_queued:
            raise Overloaded(
                f"the queue is full ({self.max_queued} requests); try again shortly", 1
            )
        if req.request_id is None:
            req = dataclasses.replace(
                req, request_id=fresh_id(self._ids, self._holding.__contains__)
            )
        rid = req.request_id
        assert rid is not None
        if rid in self._holding:
            raise BadRequest(409, f"request_id: {rid!r} is already in use by a queued request")
        i = choose_replica(self._work_ms)
        length = self.app_lengths().get(req.app, 0)  # a bad app or position: the runtime says so
        work_ms = self.deployment.solo_ms(req.app, req.position) if req.position < length else 0.0
        self._holding[rid] = (i, work_ms)
        self._work_ms[i] += work_ms
        try:
            return await self.runtimes[i].submit(req, raw)
        finally:
            self._holding.pop(rid)
            self._work_ms[i] -= work_ms

    def estimate_ms(self, app: str, position: int = 0) -> float | None:
        """The completion time the replica a request would join now plans for it."""
        return self.runtimes[choose_replica(self._work_ms)].estimate_ms(app, position)

    # --- status ---------------------------------------------------------------------------------
    def queue_by_stage(self) -> dict[tuple[str, int], int]:
        total: Counter[tuple[str, int]] = Counter()
        for r in self.runtimes:
            total.update(r.queue_by_stage())
        return dict(total)

    def status(self) -> dict[str, Any]:
        """The totals (what one runtime's status says, summed) and each replica's own state
        under "replicas": what it holds, its running step and its calibration."""
        docs = [r.status() for r in self.runtimes]
        own = ("queued", "running", "store_bytes", "time_scale", "stage_scales", "decode_ms",
               "step_gap_ms", "admission_share", "failure")  # fmt: skip
        out = {k: v for k, v in docs[0].items() if k not in own}
        out["accepting"] = self.accepting
        out["queued"] = sum(d["queued"] for d in docs)
        out["queue"] = {f"{m}[{k}]": n for (m, k), n in sorted(self.queue_by_stage().items())}
        out["store_bytes"] = sum(d["store_bytes"] for d in docs)
        out["failure"] = next((d["failure"] for d in docs if d["failure"]), None)
        out["replicas"] = [{k: d[k] for k in own} for d in docs]
        return out

"""The runtime's view of the active requests, shared by the simulator and the server.

The runtime owns a `SchedulerState`: it adds arrivals, advances requests after each executed
action and removes finished or dropped ones. Policies read it and keep their reusable tables in
`memo`, a dict that belongs to this state (never to a module or a policy object).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

from scheduler.deployment import Deployment
from scheduler.errors import InputError
from scheduler.types import Action, Request, Step


class SchedulerState:
    """Active requests by id, in arrival order, plus the memo tables of the policies."""

    def __init__(self, deployment: Deployment, requests: Iterable[Request] = ()) -> None:
        self.deployment = deployment
        self._requests: dict[str, Request] = {}
        self.memo: dict[str, Any] = {}
        # what the device is doing, set by the engine: the running step (its requests are still
        # listed here, at the positions they had when it started) and a step running beside it
        # on a second lane (stacking; its requests are not listed until it finishes)
        self.running: Step | None = None
        self.beside: Step | None = None
        for r in requests:
            self.add(r)

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests.values())

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests

    def get(self, request_id: str) -> Request:
        return self._requests[request_id]

    def requests(self) -> list[Request]:
        return list(self._requests.values())

    def add(self, request: Request, source: str = "request") -> None:
        """Admit a request; an unknown app, a position outside its app or a reused id is refused."""
        d = self.deployment
        if request.app not in d.apps:
            raise InputError(
                source, "app", f"one of the served apps ({', '.join(sorted(d.apps))})", request.app
            )
        length = d.app_length(request.app)
        if not 0 <= request.position < length:
            raise InputError(
                source,
                "position",
                f"a stage index in [0, {length}) for app {request.app}",
                request.position,
            )
        if request.id in self._requests:
            raise InputError(source, "id", "an id not already in use", request.id)
        self._requests[request.id] = request

    def remove(self, request_ids: Iterable[str]) -> list[Request]:
        return [self._requests.pop(r) for r in request_ids if r in self._requests]

    def advance(self, action: Action, stages_done: int) -> list[Request]:
        """Move the action's requests forward by `stages_done` stages; return (and remove) the
        requests that thereby finished their app."""
        done = []
        for rid in action.request_ids:
            r = self._requests[rid]
            moved = dataclasses.replace(r, position=r.position + stages_done)
            if moved.position >= self.deployment.app_length(r.app):
                del self._requests[rid]
                done.append(moved)
            else:
                self._requests[rid] = moved
        return done

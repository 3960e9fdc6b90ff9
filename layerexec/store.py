"""Per-request activation store: each active request's current tensor and where it stands.

The server's event loop admits and drops requests while the executor thread runs actions, so
every operation takes the store's lock. A request's tensor is freed when it finishes or is
dropped; nothing else in the store changes when one request is refused or removed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Slot:
    """`value` is the input of the stage at `position` (over the app's chain), one sample."""

    app: str
    position: int
    value: Any


class ActivationStore:
    def __init__(self) -> None:
        self._slots: dict[str, Slot] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._slots)

    def __contains__(self, request_id: object) -> bool:
        with self._lock:
            return request_id in self._slots

    def put(self, request_id: str, app: str, position: int, value: Any) -> None:
        with self._lock:
            if request_id in self._slots:
                raise ValueError(f"request {request_id!r} is already in the store")
            self._slots[request_id] = Slot(app, position, value)

    def get(self, request_id: str) -> Slot:
        with self._lock:
            slot = self._slots.get(request_id)
        if slot is None:
            raise KeyError(f"request {request_id!r} is not in the store")
        return slot

    def take(self, request_ids: Iterable[str]) -> list[Slot]:
        """The slots of `request_ids` (all must be present), left in place."""
        with self._lock:
            missing = [r for r in request_ids if r not in self._slots]
            if missing:
                raise KeyError(f"requests not in the store: {', '.join(missing)}")
            return [self._slots[r] for r in request_ids]

    def take_present(self, request_ids: Iterable[str]) -> tuple[tuple[str, ...], list[Slot]]:
        """Those of `request_ids` still in the store, in order, and their slots (left in place)."""
        with self._lock:
            present = tuple(r for r in request_ids if r in self._slots)
            return present, [self._slots[r] for r in present]

    def update(self, request_id: str, position: int, value: Any) -> bool:
        """Move a request on; False if it was dropped meanwhile (then nothing is stored)."""
        with self._lock:
            slot = self._slots.get(request_id)
            if slot is None:
                return False
            slot.position, slot.value = position, value
            return True

    def drop(self, request_ids: Iterable[str]) -> int:
        """Free the requests' tensors; returns how many were present."""
        with self._lock:
            return sum(self._slots.pop(r, None) is not None for r in request_ids)

    def nbytes(self) -> int:
        """Bytes of memory the held tensors keep alive. A request's tensor is a row of the batch
        output it came from, so a batch's memory is counted (once) until its last row moves on."""
        with self._lock:
            values = [s.value for s in self._slots.values()]
        storages = {}
        for v in values:
            if isinstance(v, torch.Tensor):
                st = v.untyped_storage()
                storages[st.data_ptr()] = st.nbytes()
        return sum(storages.values())

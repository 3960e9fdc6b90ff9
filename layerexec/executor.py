"""The executor: runs the `Action`s the scheduler hands it, and decides nothing (paper 003, 5.1).

`run(Action(model, (k0, k1), ids))` gathers the requests' tensors (all must stand at stage k0 of
`model`) into one batch, runs stages k0..k1-1 under `torch.inference_mode()`, and scatters the
outputs back into the store. Before each stage it checks `cancel` (Irina's exit op, paper 002
section 3.1): when set, it stops at that stage boundary and reports how far it got; the outputs
so far are kept, so nothing is recomputed. A request that reaches the end of a model moves on to
the next model of its app with that output as its input; one that reaches the end of its app is
removed from the store and its result returned.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from layerexec.store import ActivationStore
from layerexec.zoo import StagedModel
from scheduler.deployment import Deployment
from scheduler.types import Action


class ShapeError(ValueError):
    """A tensor that does not fit the stage it is meant for; names the stage and both shapes."""


class NotAtStage(ValueError):
    """An action names a request that does not stand at the action's first stage."""


@dataclass(frozen=True)
class Progress:
    """How far an action got: `stages_done` of the requested stages (fewer when cancelled), and
    the results of the requests it finished (request id -> the last model's output)."""

    action: Action
    stages_done: int
    finished: dict[str, Any] = field(default_factory=dict)
    batch: int | None = None  # requests in the batch that ran (None: all the action names)

    @property
    def batch_size(self) -> int:
        return self.action.batch_size if self.batch is None else self.batch

    @property
    def cancelled(self) -> bool:
        return self.stages_done < self.action.stages[1] - self.action.stages[0]


class Executor:
    def __init__(
        self,
        deployment: Deployment,
        models: Mapping[str, StagedModel],
        device: str | torch.device = "cpu",
        channels_last: bool = False,
    ) -> None:
        for name, profile in deployment.profiles.items():
            if name not in models:
                raise ValueError(f"no loaded model for profile {name!r}")
            if len(models[name].stages) != profile.num_stages:
                raise ValueError(
                    f"model {name!r} has {len(models[name].stages)} stages but its profile has "
                    f"{profile.num_stages}"
                )
        self.deployment = deployment
        self.models = dict(models)
        self.device = torch.device(device)
        self.channels_last = channels_last
        self.store = ActivationStore()
        self._side: ThreadPoolExecutor | None = None
        for m in self.models.values():
            m.to(self.device, channels_last)

    def admit(self, request_id: str, app: str, position: int, value: torch.Tensor) -> None:
        """Store a request's input for the stage at `position` (one sample, no batch dim)."""
        model, stage = self.deployment.locate(app, position)
        self._check_shape(model, stage, value)
        self.store.put(request_id, app, position, value)

    def drop(self, request_ids: Sequence[str]) -> int:
        return self.store.drop(request_ids)

    def run(
        self,
        action: Action,
        cancel: Callable[[], bool] | None = None,
        skip_dropped: bool = False,
    ) -> Progress:
        """Run the action (see the module docstring). Raises NotAtStage before running anything
        if a request does not stand at the first stage, KeyError if one is not in the store.

        With `skip_dropped`, requests no longer in the store (dropped after the action was
        planned: their client went away) are left out of the batch instead (`Progress.batch`
        says how many ran); with none left nothing runs and the stages count as done."""
        d = self.deployment
        model, (k0, k1) = action.model, action.stages
        staged = self.models[model]
        if skip_dropped:
            ids, slots = self.store.take_present(action.request_ids)
            if not ids:
                return Progress(action, k1 - k0, batch=0)
        else:
            ids, slots = tuple(action.request_ids), self.store.take(action.request_ids)
        for rid, slot in zip(ids, slots, strict=True):
            at = d.locate(slot.app, slot.position)
            if at != (model, k0):
                raise NotAtStage(
                    f"request {rid!r} stands at {at[0]}[{at[1]}], not at {model}[{k0}]"
                )
        x = self._gather([s.value for s in slots])
        done = 0
        with torch.inference_mode():
            for k in range(k0, k1):
                if cancel is not None and cancel():
                    break
                x = staged.stages[k](x)
                done += 1
        if done == 0:
            return Progress(action, 0, batch=len(ids))
        finished: dict[str, Any] = {}
        for rid, slot, value in zip(ids, slots, _scatter(x, len(slots)), strict=True):
            position = slot.position + done
            if position >= d.app_length(slot.app):
                if self.store.drop([rid]):
                    finished[rid] = value
            else:
                self.store.update(rid, position, value)
        return Progress(action, done, finished, len(ids))

    def run_stacked(
        self,
        a: Action,
        b: Action,
        cancel_a: Callable[[], bool] | None = None,
        cancel_b: Callable[[], bool] | None = None,
    ) -> tuple[Progress, Progress]:
        """Run two actions of different models at the same time (stacking, paper 002 section
        2.2): `b` on a second thread, each on its own CUDA stream on a GPU; on a CPU the two
        threads share the intra-op threads. Each suffers the slowdown the profile records."""
        if a.model == b.model:
            raise ValueError("stacking runs actions of two different models")
        if set(a.request_ids) & set(b.request_ids):
            raise ValueError("stacked actions must not share requests")
        if self._side is None:
            self._side = ThreadPoolExecutor(1, thread_name_prefix="layerexec-stack")
        other = self._side.submit(self.run_on_stream, b, cancel_b)
        first = self.run_on_stream(a, cancel_a)
        return first, other.result()

    def run_on_stream(
        self,
        action: Action,
        cancel: Callable[[], bool] | None = None,
        skip_dropped: bool = False,
    ) -> Progress:
        """`run` on a CUDA stream of its own (plain `run` on a CPU): callable from a second
        thread while another action runs (stacking); the two must not share requests."""
        if self.device.type != "cuda":
            return self.run(action, cancel, skip_dropped)
        stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(stream):
            progress = self.run(action, cancel, skip_dropped)
        stream.synchronize()
        return progress

    def close(self) -> None:
        if self._side is not None:
            self._side.shutdown()
            self._side = None

    def _gather(self, values: list[torch.Tensor]) -> torch.Tensor:
        """One batch from per-sample tensors: a view for one request, else one copy straight
        into the executor's memory layout."""
        first = values[0]
        layout = (
            torch.channels_last
            if self.channels_last and first.dim() == 3
            else torch.contiguous_format
        )
        if len(values) == 1:
            x = first.unsqueeze(0)
        else:
            x = torch.empty(
                (len(values), *first.shape),
                dtype=first.dtype,
                device=first.device,
                memory_format=layout,
            )
            torch.stack(values, out=x)
        x = x.to(self.device)
        if not x.is_contiguous(memory_format=layout):
            x = x.contiguous(memory_format=layout)
        return x

    def _check_shape(self, model: str, stage: int, value: torch.Tensor) -> None:
        expected = self.models[model].in_shapes[stage]
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else None
        if got != expected:
            name = self.models[model].names[stage]
            raise ShapeError(
                f"{model} stage {stage} ({name}): expected an input of shape {list(expected)}, "
                f"got {list(got) if got is not None else type(value).__name__}"
            )


def _scatter(x: Any, n: int) -> list[Any]:
    """One value per sample of a batch output. A stage returns a batched tensor (its rows), a
    tuple or dict of batched tensors (per-sample tuples or dicts, e.g. UltraFace's (scores,
    boxes)), or a list with one result per sample (e.g. the detector's per-image dicts)."""
    if isinstance(x, torch.Tensor):
        return list(x.unbind(0))
    if isinstance(x, list):
        if len(x) != n:
            raise TypeError(f"a stage returned a list of {len(x)} results for {n} samples")
        return x
    if isinstance(x, tuple):
        columns = [_scatter(part, n) for part in x]
        return [tuple(col[i] for col in columns) for i in range(n)]
    if isinstance(x, dict):
        columns_by_key = {k: _scatter(v, n) for k, v in x.items()}
        return [{k: col[i] for k, col in columns_by_key.items()} for i in range(n)]
    raise TypeError(f"cannot split a stage output of type {type(x).__name__} into {n} samples")

"""Putting a server together: models loaded once, their profiles (measured if missing), B from
the memory budget, the deployment and the runtime."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from layerexec import zoo
from layerexec.allocator import keep_freed_memory, reserve_heap
from layerexec.memory import batch_bound
from layerexec.profiler import profile_model
from layerexec.script import script_stages
from layerexec.torch_thread import TorchThread
from scheduler.deployment import (
    DEFAULT_GROUPS,
    DEFAULT_MIN_GROUP_MS,
    Deployment,
    groups_by_duration,
)
from scheduler.errors import InputError
from scheduler.profile import Profile, dumps_profile, load_profile_of
from scheduler.types import App
from server.metrics import Metrics
from server.replicas import Replicas
from server.runtime import Runtime, spare_cores
from server.step_log import StepLog

DEFAULT_APPS = ("resnet18", "mobilenet_v2", "googlenet", "resnet20_cifar10", "ultraface_slim320")
BUNDLED_PROFILES = Path(__file__).resolve().parent.parent / "traces" / "data" / "profiles"
PROFILE_BATCH_SIZES = (1, 2, 4, 8, 16)
PROFILE_MAX_BATCH = 32


def profile_path(directory: Path, model: str) -> Path:
    return directory / f"{model}-cpu.json"


def ensure_profile(
    model: zoo.StagedModel,
    directory: Path,
    progress: Callable[[str, int], Callable[[int], None]] | None,
) -> Profile:
    """The model's CPU profile from `directory`, measured there first if it is missing; a file
    holding another model's profile, or another number of stages, is refused naming it."""
    path = profile_path(directory, model.name)
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        tick = (
            progress(model.name, len(PROFILE_BATCH_SIZES) * len(model.stages)) if progress else None
        )
        doc = profile_model(
            model, PROFILE_BATCH_SIZES, time.perf_counter, progress=tick,
            device_name=f"cpu-{torch.get_num_threads()}t", max_batch=PROFILE_MAX_BATCH,
        )  # fmt: skip
        path.write_text(dumps_profile(doc))
    profile = load_profile_of(path, model.name, f"the model served from {path.name}")
    if profile.num_stages != len(model.stages):
        raise InputError(
            str(path), "stages", f"{len(model.stages)} stages for {model.name} (re-measure it)"
        )
    return profile


def build_runtime(
    apps: Sequence[str] = DEFAULT_APPS,
    policy: str = "dp-tardy",
    profiles_dir: Path = BUNDLED_PROFILES,
    memory_mb: float | None = None,
    threads: int | None = None,
    groups: int = DEFAULT_GROUPS,
    max_queued: int = 1000,
    progress: Callable[[str, int], Callable[[int], None]] | None = None,
    fold_batch_norm: bool = True,
    decode_threads: int | None = None,
    step_log: Path | None = None,
    min_group_ms: float = DEFAULT_MIN_GROUP_MS,
    replicas: int = 1,
    script: bool = True,
) -> Runtime | Replicas:
    """A runtime serving each named model as an app of its own name (batch norms folded into
    the convolutions before them unless `fold_batch_norm` is False: `zoo.load_model`). Freed
    activation memory stays in the process from here on (`layerexec.allocator`). The models are
    loaded, profiled if need be and warmed up on the runtime's executor thread, and the calling
    thread runs no torch op (`layerexec.torch_thread`). With `step_log`, every step is written
    there (`server.step_log`). Each model is cut into at most `groups` layer groups, fewer where
    its groups would take less than `min_group_ms` each at batch 1 (`groups_by_duration`).
    With `replicas` > 1, that many runtimes behind one `Replicas` (`server.replicas`), each on
    an executor thread of its own with `threads` torch threads, the weights loaded once; each
    decodes on a thread of its own when cores are left over, else on its executor thread between
    steps (on threads of their own beside two one-thread lanes on two cores, the decodes took
    the lanes' cores in a burst: 0.021 less on time over 18 pairs, `bench/results/peers-log.md`).
    With `script` (the default), each stage runs as TorchScript, without the GIL between its ops
    (`layerexec.script`)."""
    keep_freed_memory()
    if threads is not None:
        torch.set_num_threads(threads)
    unknown = [a for a in apps if a not in zoo.MODELS]
    if unknown or not apps:
        raise InputError(
            "--apps", "", f"a comma list of {', '.join(sorted(zoo.MODELS))}", ",".join(unknown)
        )
    if replicas < 1:
        raise InputError("--replicas", "", "a positive number of replicas", replicas)
    if replicas > 1 and decode_threads is None:
        decode_threads = spare_cores(replicas * torch.get_num_threads())
    log = None if step_log is None else StepLog(step_log)  # a bad path fails before loading
    pool = [TorchThread(f"layerbatch-exec{i or ''}") for i in range(replicas)]
    metrics = Metrics()
    memory = None if memory_mb is None else memory_mb * 2**20

    def load() -> tuple[dict[str, zoo.StagedModel], Deployment]:  # on the first thread
        models = zoo.load_models(apps, fold_batch_norm=fold_batch_norm)
        profiles = [_profile(m, profiles_dir, progress, memory_mb) for m in models.values()]
        if script:  # after profiling, which walks the eager stages' graphs for their memory
            models = {n: script_stages(m, channels_last=True) for n, m in models.items()}
        per_model = groups_by_duration(profiles, groups, min_group_ms)
        return models, Deployment(profiles, [App(m, (m,)) for m in models], groups=per_model)

    def build(i: int, models: dict[str, zoo.StagedModel], deployment: Deployment) -> Runtime:
        runtime = Runtime(
            deployment, models, policy, max_queued=max_queued, memory_bytes=memory,
            decode_threads=decode_threads, torch_thread=pool[i], step_log=log, metrics=metrics,
            replica=i if replicas > 1 else None,
        )  # fmt: skip
        warm_up(runtime)
        return runtime

    try:
        models, deployment = pool[0].call(load)
        runtimes = [t.call(build, i, models, deployment) for i, t in enumerate(pool)]
    except BaseException:
        for t in pool:
            t.close()
        if log is not None:
            log.close()
        raise
    return runtimes[0] if replicas == 1 else Replicas(runtimes, max_queued)


def _profile(
    model: zoo.StagedModel,
    directory: Path,
    progress: Callable[[str, int], Callable[[int], None]] | None,
    memory_mb: float | None,
) -> Profile:
    """The model's profile (`ensure_profile`), its max batch bounded by `memory_mb` if given."""
    profile = ensure_profile(model, directory, progress)
    if memory_mb is None:
        return profile
    peaks = [s.peak_bytes for s in profile.stages]
    bound = batch_bound(peaks, int(memory_mb * 2**20), profile.max_batch)
    if bound < 1:
        need = max(peaks) / 2**20
        raise InputError(
            "--memory-mb", "", f"at least {need:.1f} MB (one sample of {model.name})", memory_mb
        )
    return dataclasses.replace(profile, max_batch=bound)


def warm_up(runtime: Runtime) -> None:
    """Run every model once at batch 1 and 2, so that the first requests do not pay for the
    lazy set-up of kernels and memory pools (measured: 3-6x the steady latency), and once at
    the largest batch it may run (`Deployment.batch_limit`); then leave the heap room for two
    of the largest activations any model makes at that batch (`layerexec.allocator`).
    Without them a burst's first steps at batch sizes larger than any before wrote their
    activations into fresh memory: on this project's 2-core VM, resnet18's first stage (a 77 MB
    output at batch 25) then took 140-400 ms against 54-78 planned, under the Azure trace at
    10 req/s; with both, the first stage's largest steps took at most 1.25x their plan."""
    for name, model in runtime.models.items():
        for n in sorted({1, 2, runtime.deployment.batch_limit(name)}):
            x = torch.zeros(n, *model.spec.input_shape)
            if runtime.executor.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            model.run(x)
    d = runtime.deployment
    reserve_heap(2 * max(d.profiles[m].peak_bytes * d.batch_limit(m) for m in runtime.models))

"""Pre-partitioning (PPipe 5.2): a `layerbatch.profile/1` model grouped into N equal-time blocks.

Grouping. Stage k of the model takes t_k ms on the reference GPU at the reference batch
(default: the first profile given, batch 1); T = sum_k t_k, mean block time mu = T / N. A
grouping is cuts 0 = s_0 < s_1 < ... < s_N = n (blocks of consecutive stages, non-empty) with
block times B_i = sum_{s_i <= k < s_{i+1}} t_k. We take, by two O(N n^2) dynamic programs,

    the least  max_i |B_i - mu|,  and among the groupings reaching it the least  sum_i (B_i - mu)^2.

Guarantee: max_i |B_i - mu| <= max_k t_k. (If mu > max t: cutting at the stage boundary nearest
to i * mu leaves every cumulative time within max t / 2 of i * mu, cuts strictly increasing. If
mu <= max t: closing a block as soon as it reaches mu gives at most N blocks each below
mu + max t; splitting blocks to reach N only lowers them, and no block is below mu - max t <= 0.)
The paper's own rule is greedy (grow a block until it is as close as possible to T / N); the
min-max program meets the bound for every input, which the greedy rule need not.

Blocks on every profile. The same cuts apply to every profile of the model (one file per GPU
type, same stages in the same order; the paper notes the reference GPU barely matters). Block i
on GPU type k at batch b takes sum of its stages' `latency_ms(stage, b)` (the profile's
interpolation, `scheduler.profile`), for b = 1 .. that profile's max_batch, stored in
microseconds at MPS level 1 only (the format has no MPS measurements).

Cut sizes. The format stores `out_bytes` per stage: bytes per sample of its output. The cut
after block i is the out_bytes of its last stage in the reference profile; a stage storing 0
(not measured) with an `out_shape` is estimated as prod(out_shape) x the size of the input dtype,
and one with neither counts as 0 bytes (a free transfer; `unmeasured_cuts` lists them).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scheduler.errors import InputError
from scheduler.pipeline.profiles import ModelProfiles
from scheduler.profile import Profile, load_profile

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1, "int8": 1, "float64": 8}
_TIE = 1e-12


def equal_time_bounds(times_ms: Sequence[float], blocks: int) -> tuple[int, ...]:
    """Cuts (0, s_1, ..., n) of `times_ms` into `blocks` contiguous non-empty blocks: least
    largest deviation from the mean block time, then least sum of squared deviations (module).

    Raises InputError unless 1 <= blocks <= len(times_ms) and every time is finite and >= 0.
    """
    n = len(times_ms)
    if not isinstance(blocks, int) or not 1 <= blocks <= n:
        raise InputError("blocks", "N", f"between 1 and the {n} stages of the model", blocks)
    if any(not (math.isfinite(t) and t >= 0) for t in times_ms):
        raise InputError("blocks", "stage times", "finite non-negative milliseconds", times_ms)
    cum = np.concatenate([[0.0], np.cumsum(np.asarray(times_ms, dtype=float))])
    mean = cum[-1] / blocks
    worst = _program(cum, blocks, mean, None)[0]
    limit = worst + _TIE * max(1.0, abs(mean))
    return _program(cum, blocks, mean, limit)[1]


def _program(
    cum: np.ndarray, blocks: int, mean: float, limit: float | None
) -> tuple[float, tuple[int, ...]]:
    """limit None: min over groupings of max |B - mean|. Else: min sum (B - mean)^2 over
    groupings with every |B - mean| <= limit. Returns (optimum, cuts); first-found on ties."""
    n = len(cum) - 1
    best = np.full((blocks + 1, n + 1), np.inf)
    arg = np.zeros((blocks + 1, n + 1), dtype=int)
    best[0, 0] = 0.0
    for p in range(1, blocks + 1):
        for i in range(p, n - (blocks - p) + 1):
            starts = np.arange(p - 1, i)
            dev = np.abs(cum[i] - cum[starts] - mean)
            prev = best[p - 1, starts]
            if limit is None:
                cost = np.maximum(prev, dev)
            else:
                cost = np.where(dev <= limit, prev + dev * dev, np.inf)
            j = int(np.argmin(cost))
            best[p, i], arg[p, i] = cost[j], int(starts[j])
    cuts = [n]
    for p in range(blocks, 0, -1):
        cuts.append(int(arg[p, cuts[-1]]))
    return float(best[blocks, n]), tuple(reversed(cuts))


def gpu_type_of(profile: Profile) -> str:
    """The GPU type a profile stands for: its device up to the first '-' ("T4-tensorrt" -> T4)."""
    return profile.device.split("-", 1)[0]


def _cut_bytes(profile: Profile, stage: int) -> int | None:
    s = profile.stages[stage]
    if s.out_bytes > 0:
        return s.out_bytes
    if s.out_shape is not None and profile.input_dtype in DTYPE_BYTES:
        return math.prod(s.out_shape) * DTYPE_BYTES[profile.input_dtype]
    return None


@dataclass(frozen=True)
class BlockGrouping:
    """What `group_blocks` made: the profiles, the stage cuts and the cuts with no size."""

    profiles: ModelProfiles
    stage_bounds: tuple[int, ...]
    block_ms: tuple[float, ...]  # per block, on the reference GPU at the reference batch
    unmeasured_cuts: tuple[int, ...]  # block indices j whose output size is unknown (0 used)


def group_blocks(
    profiles: Sequence[tuple[str, Profile]],
    blocks: int,
    *,
    reference_batch: int = 1,
    source: str = "profiles",
) -> BlockGrouping:
    """Group one model's profiles (GPU type, profile), the first the reference, into `blocks`
    blocks of nearly equal time (module docstring) and build its `ModelProfiles`.

    Raises InputError for no profiles, profiles of different models or stage counts, a GPU type
    given twice, a bad N or reference batch.
    """
    if not profiles:
        raise InputError(source, "profile", "at least one layerbatch.profile/1 file")
    ref_gpu, ref = profiles[0]
    seen: set[str] = set()
    for gpu, prof in profiles:
        if gpu in seen:
            raise InputError(source, "profile", "one profile per GPU type", gpu)
        seen.add(gpu)
        if prof.model != ref.model:
            raise InputError(source, "model", f"profiles of one model ({ref.model})", prof.model)
        if prof.num_stages != ref.num_stages:
            raise InputError(
                source, f"{gpu}.stages", f"{ref.num_stages} stages like {ref_gpu}", prof.num_stages
            )
    if not isinstance(reference_batch, int) or not 1 <= reference_batch <= ref.max_batch:
        raise InputError(source, "reference_batch", f"1..{ref.max_batch}", reference_batch)
    times = [ref.latency_ms(k, reference_batch) for k in range(ref.num_stages)]
    bounds = equal_time_bounds(times, blocks)
    tables = {}
    for gpu, prof in profiles:
        rows = []
        for a, b in itertools.pairwise(bounds):
            rows.append(
                tuple(
                    sum(prof.latency_ms(k, batch) for k in range(a, b)) * 1000.0
                    for batch in range(1, prof.max_batch + 1)
                )
            )
        tables[(gpu, 1)] = tuple(rows)
    cuts, unmeasured = [], []
    for j, end in enumerate(bounds[1:-1]):
        size = _cut_bytes(ref, end - 1)
        if size is None:
            unmeasured.append(j)
        cuts.append(size or 0)
    model = ModelProfiles(
        model=ref.model, num_blocks=blocks, latency_us=tables, cut_bytes=tuple(cuts)
    )
    block_ms = tuple(sum(times[a:b]) for a, b in itertools.pairwise(bounds))
    return BlockGrouping(model, bounds, block_ms, tuple(unmeasured))


def load_block_profiles(
    paths: Sequence[str | Path],
    blocks: int,
    *,
    gpus: Sequence[str | None] | None = None,
    reference_batch: int = 1,
) -> BlockGrouping:
    """Read `layerbatch.profile/1` files (one per GPU type; the first is the reference) and
    group them into `blocks` blocks. `gpus[i]` names file i's GPU type (None or missing: its
    device up to the first '-'). Raises InputError for unreadable or invalid files and for
    everything `group_blocks` refuses."""
    named = []
    for i, path in enumerate(paths):
        prof = load_profile(path)
        given = gpus[i] if gpus is not None and i < len(gpus) else None
        named.append((given or gpu_type_of(prof), prof))
    return group_blocks(
        named, blocks, reference_batch=reference_batch, source=", ".join(map(str, paths))
    )


def load_block_models(
    specs: Sequence[str], blocks: int, resolve: Callable[[str], str | Path] = str
) -> list[BlockGrouping]:
    """`--profile` arguments, each `FILE` or `GPU=FILE` (`resolve` turns FILE into the path
    to read, e.g. a shipped profile's name into its file), grouped by the model their files
    hold (in the order models first appear; a model's first file is its reference) and each
    model grouped into `blocks` blocks. InputError as `load_block_profiles`."""
    by_model: dict[str, list[tuple[str, Profile]]] = {}
    sources: dict[str, list[str]] = {}
    for spec in specs:
        gpu, name = _split_spec(spec)
        path = str(resolve(name))
        prof = load_profile(path)
        by_model.setdefault(prof.model, []).append((gpu or gpu_type_of(prof), prof))
        sources.setdefault(prof.model, []).append(path)
    return [
        group_blocks(named, blocks, source=", ".join(sources[model]))
        for model, named in by_model.items()
    ]


def _split_spec(spec: str) -> tuple[str | None, str]:
    """`GPU=FILE` -> (GPU, FILE) unless `spec` is itself an existing file; else (None, spec)."""
    name, sep, rest = spec.partition("=")
    if sep and name and "/" not in name and not Path(spec).exists():
        return name, rest
    return None, spec

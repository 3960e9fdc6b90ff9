"""Per-stage latency profiles (`layerbatch.profile/1`) and the latency model built from them.

A profile holds, for one model on one device, the measured latency of every stage at a few batch
sizes. `Profile.latency_ms(stage, b)` is defined for every integer b >= 0:
  - b = 0: 0 ms;
  - b between two measured sizes: linear interpolation;
  - b below the smallest measured size b0: linear between (0, 0) and (b0, h(b0));
  - b above the largest measured size, up to `max_batch`: linear extrapolation from the last two
    measured points (never below the last measured latency);
  - b > `max_batch`: +inf (the batch does not fit).

Loading refuses a key the format does not name (PROFILE_KEYS, INPUT_KEYS, STAGE_KEYS,
STACKING_KEYS), so a misspelt one is never silently ignored, and guarantees every measured
latency lies in [0, MAX_LATENCY_MS] (one hour), every byte count in [0, MAX_SAMPLE_BYTES] (a
TiB), every batch size, measured or `max_batch`, in [1, MAX_BATCH] and every stacking slowdown
in (0, MAX_SLOWDOWN], so sums and squares of latencies and bytes over a whole model stay far
from float overflow and latency tables up to `max_batch` stay small.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.errors import InputError
from scheduler.validate import MAX_LATENCY_MS as MAX_LATENCY_MS  # one hour (re-exported)
from scheduler.validate import (
    MAX_SAMPLE_BYTES,
    int_list,
    is_int,
    is_number,
    json_object,
    known_keys,
    latency_at_most_an_hour,
    nonempty_str,
    read_json,
)

FORMAT = "layerbatch.profile/1"
MAX_BATCH = 4096  # the largest batch size (measured or max_batch) a profile may name
# The keys a profile may hold (a misspelt one is refused, not ignored): those read, then those
# only recorded (how `layerbatch profile` measured: layout, weights, batch_norm,
# memory_budget_mb; where a converted profile came from: source, sim/ppipe.py).
PROFILE_KEYS = (
    "format", "model", "device", "input", "batch_sizes", "stages", "max_batch", "stacking",
    "layout", "weights", "batch_norm", "source", "memory_budget_mb",
)  # fmt: skip
INPUT_KEYS = ("shape", "dtype")
STAGE_KEYS = ("name", "latency_ms", "out_shape", "out_bytes", "peak_bytes")
STACKING_KEYS = ("slowdown", "batch")  # batch: the other model's, as measured (recorded)
MAX_SLOWDOWN = 1000.0  # the largest stacking slowdown factor a profile may hold


@dataclass(frozen=True)
class StageProfile:
    """One stage: its measured latencies (aligned with the profile's batch sizes) and output."""

    name: str
    latency_ms: tuple[float, ...]
    out_shape: tuple[int, ...] | None
    out_bytes: int
    peak_bytes: int = 0  # activation peak per sample while the stage runs (0: not measured)


@dataclass(frozen=True)
class Profile:
    """Latency of each stage of one model on one device; see the module docstring for the model."""

    model: str
    device: str
    input_shape: tuple[int, ...]
    input_dtype: str
    batch_sizes: tuple[int, ...]
    stages: tuple[StageProfile, ...]
    max_batch: int
    # other model -> how much slower this one runs while that one runs beside it (stacking)
    stacking_slowdown: Mapping[str, float] = field(default_factory=dict)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def peak_bytes(self) -> int:
        """The largest activation peak per sample of any stage (0 if not measured)."""
        return max((s.peak_bytes for s in self.stages), default=0)

    @property
    def batch1_ms(self) -> tuple[float, ...]:
        """Each stage's latency at batch 1."""
        return tuple(self.latency_ms(k, 1) for k in range(self.num_stages))

    def latency_ms(self, stage: int, batch: int) -> float:
        """Latency of `stage` at batch size `batch` (see module docstring); +inf above max_batch."""
        if batch <= 0:
            return 0.0
        if batch > self.max_batch:
            return math.inf
        return _interpolate(self.batch_sizes, self.stages[stage].latency_ms, batch)

    def table(self, batch_limit: int) -> tuple[tuple[float, ...], ...]:
        """`table[k][b]` = latency of stage k at batch b for b in 0..batch_limit (inf above max)."""
        return tuple(
            tuple(self.latency_ms(k, b) for b in range(batch_limit + 1))
            for k in range(self.num_stages)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "model": self.model,
            "device": self.device,
            "input": {"shape": list(self.input_shape), "dtype": self.input_dtype},
            "batch_sizes": list(self.batch_sizes),
            "stages": [
                {
                    "name": s.name,
                    "latency_ms": list(s.latency_ms),
                    "out_shape": None if s.out_shape is None else list(s.out_shape),
                    "out_bytes": s.out_bytes,
                    "peak_bytes": s.peak_bytes,
                }
                for s in self.stages
            ],
            "max_batch": self.max_batch,
            "stacking": {m: {"slowdown": f} for m, f in self.stacking_slowdown.items()},
        }


def balanced_bounds(weights: Sequence[float], parts: int) -> tuple[int, ...]:
    """Cut a sequence of positive weights (stage latencies) into min(parts, len) contiguous
    non-empty parts of about equal weight: the cut minimising the sum over parts of
    (part weight - mean part weight)^2, by dynamic programming in O(parts * n^2).
    Returns the index where each part starts (the first is 0)."""
    n = len(weights)
    parts = max(1, min(parts, n))
    cum = [0.0]
    for w in weights:
        cum.append(cum[-1] + w)
    mean = cum[-1] / parts
    # best[p][i]: least cost of cutting the first i weights into p parts; arg[p][i]: last start
    best = [[math.inf] * (n + 1) for _ in range(parts + 1)]
    arg = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for p in range(1, parts + 1):
        for i in range(p, n - (parts - p) + 1):
            for j in range(p - 1, i):
                c = best[p - 1][j] + (cum[i] - cum[j] - mean) ** 2
                if c < best[p][i]:
                    best[p][i], arg[p][i] = c, j
    starts = []
    i = n
    for p in range(parts, 0, -1):
        i = arg[p][i]
        starts.append(i)
    return tuple(reversed(starts))


def coarsen(profile: Profile, parts: int) -> Profile:
    """The profile with its stages merged into `parts` blocks of about equal batch-1 time (PPipe
    section 5.2's pre-partitioning): a block's latency at each batch size is the sum of its
    stages', its output that of its last stage."""
    starts = balanced_bounds(profile.batch1_ms, parts)
    ends = [*starts[1:], profile.num_stages]
    blocks = []
    for a, b in zip(starts, ends, strict=True):
        part = profile.stages[a:b]
        name = part[0].name if len(part) == 1 else f"{part[0].name}..{part[-1].name}"
        latency = tuple(sum(s.latency_ms[i] for s in part) for i in range(len(profile.batch_sizes)))
        peak = max(s.peak_bytes for s in part)
        blocks.append(StageProfile(name, latency, part[-1].out_shape, part[-1].out_bytes, peak))
    return Profile(
        profile.model,
        profile.device,
        profile.input_shape,
        profile.input_dtype,
        profile.batch_sizes,
        tuple(blocks),
        profile.max_batch,
        profile.stacking_slowdown,
    )


def scaled(profile: Profile, factor: float) -> Profile:
    """The profile with every latency multiplied by `factor` (a machine `factor` times slower)."""
    return scaled_stages(profile, [factor] * profile.num_stages)


def scaled_stages(profile: Profile, factors: Sequence[float]) -> Profile:
    """The profile with stage k's latencies multiplied by `factors[k]` (one factor per stage)."""
    if len(factors) != profile.num_stages:
        raise ValueError(f"{len(factors)} factors for {profile.num_stages} stages")
    stages = tuple(
        dataclasses.replace(s, latency_ms=tuple(x * f for x in s.latency_ms))
        for s, f in zip(profile.stages, factors, strict=True)
    )
    return dataclasses.replace(profile, stages=stages)


def with_entry_cost(profile: Profile, per_sample_ms: float) -> Profile:
    """The profile with `per_sample_ms` per sample added to its first stage (b x per_sample_ms
    at each measured batch size b): work each request costs the device once, before that stage,
    e.g. decoding its input on the executor thread."""
    if per_sample_ms <= 0.0:
        return profile
    first = profile.stages[0]
    sizes = profile.batch_sizes
    lat = tuple(x + b * per_sample_ms for x, b in zip(first.latency_ms, sizes, strict=True))
    stages = (dataclasses.replace(first, latency_ms=lat), *profile.stages[1:])
    return dataclasses.replace(profile, stages=stages)


def dumps_profile(doc: dict[str, Any]) -> str:
    """A profile document as JSON text with one stage per line (readable, diffable)."""
    head = {k: v for k, v in doc.items() if k != "stages"}
    stages = doc["stages"]
    lines = [json.dumps(head)[:-1] + ', "stages": [']
    lines += [
        "  " + json.dumps(s) + ("," if i < len(stages) - 1 else "") for i, s in enumerate(stages)
    ]
    lines.append("]}")
    return "\n".join(lines) + "\n"


def _interpolate(sizes: Sequence[int], lat: Sequence[float], b: int) -> float:
    if b <= sizes[0]:
        return lat[0] * b / sizes[0]
    for i in range(1, len(sizes)):
        if b <= sizes[i]:
            b0, b1 = sizes[i - 1], sizes[i]
            return lat[i - 1] + (lat[i] - lat[i - 1]) * (b - b0) / (b1 - b0)
    if len(sizes) == 1:
        return lat[0] * b / sizes[0]
    b0, b1 = sizes[-2], sizes[-1]
    slope = (lat[-1] - lat[-2]) / (b1 - b0)
    return max(lat[-1], lat[-1] + slope * (b - b1))


def load_profile(path: str | Path) -> Profile:
    """Read and validate one profile file; any problem raises `InputError` naming the field."""
    return parse_profile(read_json(path, FORMAT), str(path))


def load_profile_of(path: str | Path, model: str, why: str) -> Profile:
    """`load_profile`, refusing a file that holds another model's profile: the one sentence
    names the file, the model expected (`why`: what expects it there) and the one it holds."""
    profile = load_profile(path)
    if profile.model != model:
        raise InputError(str(path), "model", f"the profile of {model} ({why})", profile.model)
    return profile


def parse_profile(doc: object, source: str = "profile") -> Profile:
    """Validate a decoded `layerbatch.profile/1` document and build the `Profile`."""
    d = json_object(doc, source, "")
    if d.get("format") != FORMAT:
        raise InputError(source, "format", f'"{FORMAT}"', d.get("format"))
    known_keys(d, PROFILE_KEYS, source, "")
    model = nonempty_str(d.get("model"), source, "model")
    device = nonempty_str(d.get("device"), source, "device")
    inp = json_object(d.get("input"), source, "input")
    known_keys(inp, INPUT_KEYS, source, "input")
    shape = int_list(inp.get("shape"), source, "input.shape", positive=True)
    dtype = nonempty_str(inp.get("dtype"), source, "input.dtype")
    sizes = int_list(d.get("batch_sizes"), source, "batch_sizes", positive=True)
    if not sizes:
        raise InputError(source, "batch_sizes", "a non-empty list of batch sizes", sizes)
    if any(b1 <= b0 for b0, b1 in itertools.pairwise(sizes)):
        raise InputError(source, "batch_sizes", "strictly increasing batch sizes", sizes)
    if sizes[-1] > MAX_BATCH:
        raise InputError(source, "batch_sizes", f"batch sizes of at most {MAX_BATCH}", sizes[-1])
    max_batch = d.get("max_batch")
    if not is_int(max_batch) or not 1 <= max_batch <= MAX_BATCH:
        raise InputError(source, "max_batch", f"an integer from 1 to {MAX_BATCH}", max_batch)
    raw_stages = d.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise InputError(source, "stages", "a non-empty list of stages", raw_stages)
    stages = []
    for k, raw in enumerate(raw_stages):
        where = f"stages[{k}]"
        s = json_object(raw, source, where)
        known_keys(s, STAGE_KEYS, source, where)
        lat = s.get("latency_ms")
        if (
            not isinstance(lat, list)
            or len(lat) != len(sizes)
            or not all(is_number(x) and math.isfinite(x) and x >= 0 for x in lat)
        ):
            raise InputError(
                source,
                f"{where}.latency_ms",
                f"{len(sizes)} finite non-negative numbers (one per batch size)",
                lat,
            )
        for i, x in enumerate(lat):
            latency_at_most_an_hour(x, "ms", source, f"{where}.latency_ms[{i}]")
        out_shape = s.get("out_shape")
        shape_t = (
            None
            if out_shape is None
            else tuple(int_list(out_shape, source, f"{where}.out_shape", positive=True))
        )
        out_bytes = s.get("out_bytes", 0)
        if not is_int(out_bytes) or not 0 <= out_bytes <= MAX_SAMPLE_BYTES:
            raise InputError(
                source,
                f"{where}.out_bytes",
                f"a byte count from 0 to {MAX_SAMPLE_BYTES}",
                out_bytes,
            )
        peak = s.get("peak_bytes", 0)
        if not is_int(peak) or not 0 <= peak <= MAX_SAMPLE_BYTES:
            raise InputError(
                source, f"{where}.peak_bytes", f"a byte count from 0 to {MAX_SAMPLE_BYTES}", peak
            )
        name = s.get("name", f"stage{k}")
        stages.append(
            StageProfile(
                name=nonempty_str(name, source, f"{where}.name"),
                latency_ms=tuple(float(x) for x in lat),
                out_shape=shape_t,
                out_bytes=int(out_bytes),
                peak_bytes=int(peak),
            )
        )
    stacking = json_object(d.get("stacking", {}), source, "stacking")
    slowdown: dict[str, float] = {}
    for other, entry in stacking.items():
        if isinstance(entry, dict):
            known_keys(entry, STACKING_KEYS, source, f"stacking.{other}")
        factor = entry.get("slowdown") if isinstance(entry, dict) else None
        if not is_number(factor) or not 0 < factor <= MAX_SLOWDOWN:
            raise InputError(
                source,
                f"stacking.{other}.slowdown",
                f"a positive factor of at most {MAX_SLOWDOWN:g}",
                factor,
            )
        slowdown[other] = float(factor)
    return Profile(
        model=model,
        device=device,
        input_shape=tuple(shape),
        input_dtype=dtype,
        batch_sizes=tuple(sizes),
        stages=tuple(stages),
        max_batch=int(max_batch),
        stacking_slowdown=slowdown,
    )

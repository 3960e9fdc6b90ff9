"""Per-stage latency profiles (`layerbatch.profile/1`) and the latency model built from them.

A profile holds, for one model on one device, the measured latency of every stage at a few batch
sizes. `Profile.latency_ms(stage, b)` is defined for every integer b >= 0:
  - b = 0: 0 ms;
  - b between two measured sizes: linear interpolation;
  - b below the smallest measured size b0: linear between (0, 0) and (b0, h(b0));
  - b above the largest measured size, up to `max_batch`: linear extrapolation from the last two
    measured points (never below the last measured latency);
  - b > `max_batch`: +inf (the batch does not fit).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler.errors import InputError
from scheduler.validate import int_list, is_int, is_number, json_object, nonempty_str, read_json

FORMAT = "layerbatch.profile/1"


@dataclass(frozen=True)
class StageProfile:
    """One stage: its measured latencies (aligned with the profile's batch sizes) and output."""

    name: str
    latency_ms: tuple[float, ...]
    out_shape: tuple[int, ...] | None
    out_bytes: int


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

    @property
    def num_stages(self) -> int:
        return len(self.stages)

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
                }
                for s in self.stages
            ],
            "max_batch": self.max_batch,
        }


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


def parse_profile(doc: object, source: str = "profile") -> Profile:
    """Validate a decoded `layerbatch.profile/1` document and build the `Profile`."""
    d = json_object(doc, source, "")
    if d.get("format") != FORMAT:
        raise InputError(source, "format", f'"{FORMAT}"', d.get("format"))
    model = nonempty_str(d.get("model"), source, "model")
    device = nonempty_str(d.get("device"), source, "device")
    inp = json_object(d.get("input"), source, "input")
    shape = int_list(inp.get("shape"), source, "input.shape", positive=True)
    dtype = nonempty_str(inp.get("dtype"), source, "input.dtype")
    sizes = int_list(d.get("batch_sizes"), source, "batch_sizes", positive=True)
    if not sizes:
        raise InputError(source, "batch_sizes", "a non-empty list of batch sizes", sizes)
    if any(b1 <= b0 for b0, b1 in itertools.pairwise(sizes)):
        raise InputError(source, "batch_sizes", "strictly increasing batch sizes", sizes)
    max_batch = d.get("max_batch")
    if not is_int(max_batch) or max_batch < 1:
        raise InputError(source, "max_batch", "a positive integer", max_batch)
    raw_stages = d.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise InputError(source, "stages", "a non-empty list of stages", raw_stages)
    stages = []
    for k, raw in enumerate(raw_stages):
        where = f"stages[{k}]"
        s = json_object(raw, source, where)
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
        out_shape = s.get("out_shape")
        shape_t = (
            None
            if out_shape is None
            else tuple(int_list(out_shape, source, f"{where}.out_shape", positive=True))
        )
        out_bytes = s.get("out_bytes", 0)
        if not is_int(out_bytes) or out_bytes < 0:
            raise InputError(source, f"{where}.out_bytes", "a non-negative integer", out_bytes)
        name = s.get("name", f"stage{k}")
        stages.append(
            StageProfile(
                name=nonempty_str(name, source, f"{where}.name"),
                latency_ms=tuple(float(x) for x in lat),
                out_shape=shape_t,
                out_bytes=int(out_bytes),
            )
        )
    return Profile(
        model=model,
        device=device,
        input_shape=tuple(shape),
        input_dtype=dtype,
        batch_sizes=tuple(sizes),
        stages=tuple(stages),
        max_batch=int(max_batch),
    )

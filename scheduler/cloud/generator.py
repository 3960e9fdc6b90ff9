"""Workloads for the cloud cost planner: the papers' five apps on measured GPU profiles (issue 7).

Harpagon (paper 001, §IV-A) and Piccolo (paper 000, §IV) evaluate on synthetic workloads of five
multi-DNN video apps: traffic, face, pose, caption and actdet. `generate(n, rng)` draws `n` such
workloads, each one app (one session) as a workload document that `parse_workload` accepts.

DAG shapes. The papers' figures are not in the text copies; the shapes below are read from their
text (traffic: "three DNN modules to detect objects and to classify vehicles and pedestrians";
Piccolo §IV-C: apps of two or three modules) and from what each app's cited network needs in
front of it. They are this project's reconstruction, not a copy of a figure:

    traffic  detector -> vehicle, detector -> pedestrian          (fan-out, 3 modules)
    face     face_detector -> prnet                               (chain, 2)
    pose     person_detector -> openpose                          (chain, 2)
    caption  vgg_features -> s2vt                                 (chain, 2)
    actdet   detector -> tracker -> activity                      (chain, 3)

Module profiles are real measurements, bundled in `traces/data/profiles/cloud/` (see SOURCE.txt
there): PPipe's TensorRT tf32 per-block timings (JonnyKong/PPipe, data/models/block-timing-tf32)
summed over a model's blocks give the whole model's duration per batch size, on L4, T4, V100
(batch 1-8 at MPS level 1, batch 1-4 at MPS level 2) and P4 (batch 1-8, MPS level 1 only);
Nexus' TITAN X (Pascal) forward-latency tables (uwsampl/nexus) give whole models directly.

Concurrency. PPipe measured each model on a GPU split by MPS into m equal virtual GPUs; the file
for level m holds one virtual GPU's batch duration while all m run. That is Piccolo's spatial
multiplexing: concurrency m, each of the m batches taking that duration, throughput m b / d. Levels
1 and 2 are used (levels 3 and 4 were measured only at batch 1-2). P4 has level 1 only; the
Nexus tables have no co-location measurement, so their modules offer concurrency 1 only.

Module -> measured model (a stand-in where the paper's network was not measured; the mapping
keeps each module's role: detector, classifier, dense encoder-decoder, feature extractor):

    traffic.detector        SSD-Inception     -> tf_efficientdet_d1 (single-stage detector)
    traffic.vehicle         classifier        -> googlenet-v3-pytorch (Inception-v3)
    traffic.pedestrian      classifier        -> repvgg-b3
    face.face_detector      face detector     -> centernet-update_r50 (anchor-free detector)
    face.prnet              PRNet             -> cyclegan (ResNet encoder-decoder, image to map)
    pose.person_detector    person detector   -> gfl_r50 (single-stage detector)
    pose.openpose           OpenPose          -> fcn-d6_r101 (fully convolutional dense maps)
    caption.vgg_features    VGG-16 (S2VT's)   -> Nexus caffe vgg16 on TITAN X (the same network)
    caption.s2vt            S2VT LSTM         -> resnext152-32x4d (the cheapest measured model;
                                                 no sequence model was measured)
    actdet.detector         detector          -> Nexus darknet yolo9000 on TITAN X
    actdet.tracker          DeepSORT re-id    -> googlenet-v3-pytorch
    actdet.activity         activity network  -> efficientnet-b8 (the heaviest classifier)

Prices (ASSUMPTIONS, USD per GPU-hour, on demand): Google Cloud Compute Engine GPU price list,
us-central1, as listed in 2024-2025 (cloud.google.com/compute/gpus-pricing): T4 0.35, P4 0.60,
V100 2.48; L4 0.70, the g2-standard-4 machine (the L4 is sold only inside G2 machines). No cloud
rents a TITAN X; it is priced as the P100 (1.46), the closest rented GPU in FP32 throughput.
The planner only compares costs, so only the ratios matter.

Ranges (every draw from the `numpy.random.Generator` passed in):
  * app: workload i is app i mod 5 (balanced; every app appears once n >= 5);
  * source rate R (the first module's, req/s): log-uniform on SOURCE_RATE_RPS = [10, 500]
    (a few to a dozen 30-fps streams), rounded to an integer;
  * every other module: R x a factor uniform on its RATE_FACTOR range (objects per frame), rounded,
    at least 1 req/s;
  * SLO: log-uniform on [lo, hi] from `slo_bounds_s`: lo = SLO_MARGIN x the longest DAG path of
    each module's smallest GetWCL (d + b / rate over its configurations), hi = the path of the
    largest GetWCL capped at SLO_MAX_S = 2 s, and at least SLO_MIN_SPAN x lo. Below lo a plan is
    rarely feasible; above hi every configuration fits and nothing is left to decide.

Cost: loading the bundled files takes a few milliseconds; each workload then costs microseconds
plus building its document (about 0.2 ms), so 1,000 workloads take well under a second.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from scheduler.cloud.workload import App, Config
from scheduler.errors import InputError
from scheduler.pipeline.profiles import read_block_timing_us
from scheduler.validate import latency_at_most_an_hour

DATA_DIR = Path(__file__).resolve().parents[2] / "traces" / "data" / "profiles" / "cloud"

PRICE_PER_HOUR: Mapping[str, float] = MappingProxyType(
    {
        "L4": 0.70,
        "T4": 0.35,
        "V100": 2.48,
        "P4": 0.60,
        "TITANX": 1.46,
    }
)
PPIPE_GPUS: tuple[tuple[str, tuple[int, ...]], ...] = (
    # (GPU, MPS levels used as concurrency)
    ("L4", (1, 2)),
    ("T4", (1, 2)),
    ("V100", (1, 2)),
    ("P4", (1,)),
)
NEXUS_BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 64, 128)

SOURCE_RATE_RPS: tuple[float, float] = (10.0, 500.0)
SLO_MARGIN = 1.5
SLO_MAX_S = 2.0
SLO_MIN_SPAN = 2.0


@dataclass(frozen=True)
class Measured:
    """Where a measured model's numbers live: `kind` "ppipe" (per-block CSVs per GPU and MPS
    level, stem `{stem}-{GPU}-{level}.csv`) or "nexus" (`{stem}.txt`, TITAN X)."""

    kind: str
    stem: str


MODELS: Mapping[str, Measured] = MappingProxyType(
    {
        "efficientdet-d1": Measured("ppipe", "tf_efficientdet_d1"),
        "googlenet-v3": Measured("ppipe", "googlenet-v3-pytorch"),
        "repvgg-b3": Measured("ppipe", "repvgg-b3"),
        "centernet-r50": Measured("ppipe", "centernet-update_r50-caffe_fpn_ms-1x_coco"),
        "cyclegan": Measured("ppipe", "cyclegan"),
        "gfl-r50": Measured("ppipe", "gfl_r50_fpn_ms-2x_coco"),
        "fcn-r101": Measured("ppipe", "fcn-d6_r101-d16_4xb2-40k_cityscapes-512x1024"),
        "resnext152": Measured("ppipe", "resnext152-32x4d_8xb32_in1k"),
        "efficientnet-b8": Measured("ppipe", "efficientnet-b8_3rdparty_8xb32-aa-advprop_in1k"),
        "vgg16": Measured("nexus", "caffe_vgg16_1"),
        "yolo9000": Measured("nexus", "darknet_yolo9000_1"),
    }
)


@dataclass(frozen=True)
class Row:
    """One profiled configuration of a measured model."""

    hardware: str
    batch: int
    concurrency: int
    duration_s: float


@dataclass(frozen=True)
class ModuleSpec:
    """An app module: its `name` in workload documents, the `model` (a key of MODELS) whose
    measurements it uses, the paper network it `stands_for`, and its rate as a factor of the
    app's source rate, drawn uniformly on `rate_factor` (1.0 for the source)."""

    name: str
    model: str
    stands_for: str
    rate_factor: tuple[float, float]


@dataclass(frozen=True)
class AppSpec:
    """An app: modules in topological order (the first is the only source) and DAG edges."""

    name: str
    modules: tuple[ModuleSpec, ...]
    edges: tuple[tuple[str, str], ...]


def _m(name: str, model: str, stands_for: str, lo: float = 1.0, hi: float = 1.0) -> ModuleSpec:
    return ModuleSpec(name, model, stands_for, (lo, hi))


APPS: tuple[AppSpec, ...] = (
    AppSpec(
        "traffic",
        (
            _m("traffic_detector", "efficientdet-d1", "SSD-Inception"),
            _m("traffic_vehicle", "googlenet-v3", "vehicle classifier", 0.3, 2.0),
            _m("traffic_pedestrian", "repvgg-b3", "pedestrian classifier", 0.1, 1.0),
        ),
        (("traffic_detector", "traffic_vehicle"), ("traffic_detector", "traffic_pedestrian")),
    ),
    AppSpec(
        "face",
        (
            _m("face_detector", "centernet-r50", "face detector"),
            _m("face_prnet", "cyclegan", "PRNet", 0.2, 2.0),
        ),
        (("face_detector", "face_prnet"),),
    ),
    AppSpec(
        "pose",
        (
            _m("pose_person_detector", "gfl-r50", "person detector"),
            _m("pose_openpose", "fcn-r101", "OpenPose", 0.2, 2.0),
        ),
        (("pose_person_detector", "pose_openpose"),),
    ),
    AppSpec(
        "caption",
        (
            _m("caption_vgg_features", "vgg16", "VGG-16 features"),
            _m("caption_s2vt", "resnext152", "S2VT"),
        ),
        (("caption_vgg_features", "caption_s2vt"),),
    ),
    AppSpec(
        "actdet",
        (
            _m("actdet_detector", "yolo9000", "object detector"),
            _m("actdet_tracker", "googlenet-v3", "DeepSORT re-id"),
            _m("actdet_activity", "efficientnet-b8", "activity classifier", 0.1, 1.0),
        ),
        (("actdet_detector", "actdet_tracker"), ("actdet_tracker", "actdet_activity")),
    ),
)


@dataclass(frozen=True)
class Catalog:
    """The measured profiles of every model in MODELS: `rows[model]`, never empty."""

    rows: Mapping[str, tuple[Row, ...]]


def load_catalog(directory: Path = DATA_DIR) -> Catalog:
    """Read the bundled measurements under `directory` (layout of traces/data/profiles/cloud).

    Raises `InputError` naming the file for a missing or malformed one. Guaranteed: every row
    has batch >= 1, concurrency >= 1 and 0 < duration_s <= 3600 (an hour, as `parse_workload`
    takes)."""
    rows: dict[str, tuple[Row, ...]] = {}
    for key, where in MODELS.items():
        if where.kind == "ppipe":
            got: list[Row] = []
            for gpu, levels in PPIPE_GPUS:
                for level in levels:
                    path = directory / "ppipe" / f"{where.stem}-{gpu}-{level}.csv"
                    for i, us in enumerate(_ppipe_model_us(path)):
                        got.append(Row(gpu, i + 1, level, us / 1e6))
            rows[key] = tuple(got)
        else:
            path = directory / "nexus" / f"{where.stem}.txt"
            table = _nexus_forward_us(path)
            rows[key] = tuple(
                Row("TITANX", b, 1, table[b] / 1e6) for b in NEXUS_BATCHES if b in table
            )
    return Catalog(rows)


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError as exc:
        raise InputError(str(path), "", "a readable measurement file", exc.strerror) from None


def _ppipe_model_us(path: Path) -> list[float]:
    """Whole-model microseconds per batch size 1..k: the column sums of a per-block CSV."""
    table = read_block_timing_us(path)
    sums = [sum(r[j] for r in table) for j in range(len(table[0]))]
    for j, us in enumerate(sums):  # a module's duration: `parse_workload` takes up to an hour
        latency_at_most_an_hour(us, "us", str(path), f"batch {j + 1} (summed over its blocks)")
    return sums


def _nexus_forward_us(path: Path) -> dict[int, float]:
    """Batch -> forward latency (us) from a Nexus profile's `Forward latency` table."""
    lines = _read_lines(path)
    try:
        start = lines.index("batch,latency(us),std(us),memory(B)") + 1
    except ValueError:
        raise InputError(str(path), "", "a Nexus 'Forward latency' table") from None
    table: dict[int, float] = {}
    for line in lines[start:]:
        cells = line.split(",")
        if len(cells) != 4 or not cells[0].isdigit():
            break
        try:
            us = float(cells[1])
        except ValueError:
            raise InputError(
                str(path), f"batch {cells[0]}", "a latency in microseconds", cells[1]
            ) from None
        latency_at_most_an_hour(us, "us", str(path), f"batch {cells[0]}")
        table[int(cells[0])] = us
    if not table or not all(v > 0 for v in table.values()):
        raise InputError(str(path), "", "a non-empty table of positive latencies")
    return table


def app_shapes() -> dict[str, tuple[tuple[str, str], ...]]:
    """Each app's DAG edges, as documented in the module docstring."""
    return {a.name: a.edges for a in APPS}


def generate(
    n: int, rng: np.random.Generator, catalog: Catalog | None = None
) -> list[dict[str, Any]]:
    """`n` workload documents drawn with `rng` over the ranges in the module docstring.

    Guaranteed: each parses with `parse_workload` and holds exactly one app (workload i is
    APPS[i mod 5]); the same `rng` state (and catalog) gives the same documents; every
    document is a fresh object (no lists shared between documents)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    cat = catalog if catalog is not None else load_catalog()
    lo_rate, hi_rate = math.log(SOURCE_RATE_RPS[0]), math.log(SOURCE_RATE_RPS[1])
    out: list[dict[str, Any]] = []
    for i in range(n):
        app = APPS[i % len(APPS)]
        source_rps = round(math.exp(rng.uniform(lo_rate, hi_rate)))
        rates: dict[str, float] = {}
        for spec in app.modules:
            lo, hi = spec.rate_factor
            factor = lo if lo == hi else float(rng.uniform(lo, hi))
            rates[spec.name] = float(max(1, round(source_rps * factor)))
        rows = {spec.name: cat.rows[spec.model] for spec in app.modules}
        slo_lo, slo_hi = _bounds_s([s.name for s in app.modules], app.edges, rates, rows)
        slo_s = float(math.exp(rng.uniform(math.log(slo_lo), math.log(slo_hi))))
        out.append(_document(app, rates, rows, min(max(slo_s, slo_lo), slo_hi)))
    return out


def _document(
    app: AppSpec, rates: Mapping[str, float], rows: Mapping[str, Sequence[Row]], slo_s: float
) -> dict[str, Any]:
    used = sorted({r.hardware for rs in rows.values() for r in rs})
    return {
        "hardware": {h: {"price": PRICE_PER_HOUR[h]} for h in used},
        "modules": {
            m: {
                "profile": [
                    {
                        "hardware": r.hardware,
                        "batch": r.batch,
                        "concurrency": r.concurrency,
                        "duration_s": r.duration_s,
                    }
                    for r in rs
                ]
            }
            for m, rs in rows.items()
        },
        "apps": {
            app.name: {
                "edges": [[a, b] for a, b in app.edges],
                "rate_rps": dict(rates),
                "slo_s": slo_s,
            }
        },
    }


def slo_bounds_s(app: App, profiles: Mapping[str, Sequence[Config]]) -> tuple[float, float]:
    """The (lo, hi) range `generate` draws `app`'s SLO from, for a parsed workload: see the
    module docstring. Guaranteed: 0 < lo < hi."""
    rows = {
        m: [Row(c.hardware, c.batch, c.concurrency, c.duration_s) for c in profiles[m]]
        for m in app.modules
    }
    return _bounds_s(list(app.modules), app.edges, app.rate_rps, rows)


def _bounds_s(
    order: Sequence[str],
    edges: Iterable[tuple[str, str]],
    rates: Mapping[str, float],
    rows: Mapping[str, Sequence[Row]],
) -> tuple[float, float]:
    fastest = {m: min(r.duration_s + r.batch / rates[m] for r in rows[m]) for m in order}
    slowest = {m: max(r.duration_s + r.batch / rates[m] for r in rows[m]) for m in order}
    lo = SLO_MARGIN * _longest_path_s(order, edges, fastest)
    hi = max(min(SLO_MAX_S, _longest_path_s(order, edges, slowest)), SLO_MIN_SPAN * lo)
    return lo, hi


def _longest_path_s(
    order: Sequence[str], edges: Iterable[tuple[str, str]], latency_s: Mapping[str, float]
) -> float:
    """Longest source-to-sink path of per-module latencies; `order` is topological."""
    parents: dict[str, list[str]] = {m: [] for m in order}
    for a, b in edges:
        parents[b].append(a)
    to: dict[str, float] = {}
    for m in order:
        to[m] = latency_s[m] + max((to[p] for p in parents[m]), default=0.0)
    return max(to.values())

"""What one bench/peers.py run measures and how (its command line, parsed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bench.peers_knobs import Knobs

MODELS = ("resnet18", "mobilenet_v2", "googlenet")
SETTLE_PAIRS = 3  # tuning: pairs that settle the best knobs against the second best


@dataclass
class Settings:
    models: list[str]
    deadlines: list[float]
    servers: list[str]
    arrivals: list[str]
    grid: list[Knobs]
    duration_s: float
    tune_duration_s: float
    min_requests: int
    tol: float
    tune_tol: float
    seed: int
    policy: str
    out: Path
    logdir: Path
    profile_s: float
    profile_rate: float | None
    interleave: list[float]
    rounds: int
    fold_peers: bool = False
    layerbatch_replicas: tuple[int, ...] = (1,)
    pause_idle: bool = True
    report: list[Path] = field(default_factory=list)
    step_log: bool = False
    settle_pairs: int = SETTLE_PAIRS


def layerbatch_grid(st: Settings) -> list[Knobs]:
    """layerbatch's knobs to tune over: its replica counts (`--layerbatch-replicas`), fewest first."""
    return [Knobs(workers=r) for r in st.layerbatch_replicas]

"""What one bench/peers.py run measures and how (its command line, parsed)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.peers_crossing import THRESHOLD
from bench.peers_knobs import THREADS, Knobs

MODELS = ("resnet18", "mobilenet_v2", "googlenet")
SETTLE_PAIRS = 3  # tuning: pairs that settle the best knobs against the second best
FINAL_ROUNDS = 2  # the capacities: interleaved rounds per case (0: a search per server)


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
    resume: bool = False
    screen: bool = True
    final_rounds: int = FINAL_ROUNDS

    def record(self) -> dict[str, Any]:
        """The settings as a run's JSON keeps them (as JSON reads them back): what was measured
        and how, without where it was written or whether it was resumed."""
        kept = {
            k: v for k, v in asdict(self).items() if k not in ("grid", "out", "logdir", "resume")
        }
        kept |= {"grid": [k.label for k in self.grid], "threads": THREADS, "threshold": THRESHOLD}
        doc: dict[str, Any] = json.loads(json.dumps(kept, default=str))
        return doc


def layerbatch_grid(st: Settings) -> list[Knobs]:
    """layerbatch's knobs to tune over: its replica counts (`--layerbatch-replicas`), fewest first."""
    return [Knobs(workers=r) for r in st.layerbatch_replicas]

"""Pictures of simulated runs (matplotlib, no screen needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from sim.capacity import ON_TIME_TARGET


def plot_capacity(
    runs: Sequence[dict[str, Any]], caps: dict[str, float | None], title: str, path: str | Path
) -> None:
    """On-time ratio and mean completion time against rate, one line per policy (paper Fig. 5)."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for policy in caps:
        rows = sorted((r for r in runs if r["policy"] == policy), key=lambda r: r["rate_rps"])
        rates = [r["rate_rps"] for r in rows]
        cap = caps[policy]
        label = f"{policy} (capacity {cap:g} rps)" if cap is not None else f"{policy} (capacity -)"
        ax1.plot(rates, [r["on_time_ratio"] for r in rows], marker=".", label=label)
        ax2.plot(rates, [r["mean_ms"] for r in rows], marker=".", label=policy)
    ax1.axhline(ON_TIME_TARGET, color="grey", linestyle=":", linewidth=1)
    ax1.set(xlabel="request rate (req/s)", ylabel="on-time ratio", ylim=(0, 1.02))
    ax2.set(xlabel="request rate (req/s)", ylabel="mean completion time of finished requests (ms)")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    ax2.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)

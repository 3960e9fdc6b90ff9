"""Pictures of client runs: latency CDF and decisions over time (`layerbatch client --plot`),
on-time ratio against the number of clients (`layerbatch loadgen --sweep --plot`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from client.fleet import SweepPoint, capacity
from client.mobile import FrameRecord
from traces.network import LinkTrace

COLOURS = {"local": "tab:green", "full": "tab:blue", "partial": "tab:orange"}


def plot_client(
    records: Sequence[FrameRecord],
    deadline_ms: float,
    path: str | Path,
    uplink: LinkTrace | None = None,
    uplink_offset_ms: float = 0.0,
    title: str = "",
) -> None:
    """Left: CDF of completion time per decision and overall. Right: each frame's completion
    time at its arrival, coloured by decision, over the uplink's throughput (1 s windows)."""
    fig, (cdf, line) = plt.subplots(1, 2, figsize=(12, 4.2))
    groups = {"all": [r.total_ms for r in records]}
    for kind in COLOURS:
        values = [r.total_ms for r in records if r.decision == kind]
        if values:
            groups[kind] = values
    for name, values in groups.items():
        xs = np.sort(values)
        ys = np.arange(1, len(xs) + 1) / len(xs)
        style = {"color": "black", "lw": 2} if name == "all" else {"color": COLOURS[name]}
        cdf.step(xs, ys, where="post", label=f"{name} ({len(xs)})", **style)
    cdf.axvline(deadline_ms, color="red", ls="--", lw=1, label="deadline")
    cdf.set_xlabel("completion time (ms)")
    cdf.set_ylabel("fraction of frames")
    cdf.set_ylim(0, 1.01)
    cdf.legend(loc="lower right")
    cdf.grid(alpha=0.3)

    for kind, colour in COLOURS.items():
        mine = [r for r in records if r.decision == kind]
        if mine:
            line.scatter(
                [r.arrival_s for r in mine],
                [r.total_ms for r in mine],
                s=10,
                color=colour,
                label=kind,
            )
    line.axhline(deadline_ms, color="red", ls="--", lw=1)
    line.set_xlabel("time (s)")
    line.set_ylabel("completion time (ms)")
    line.legend(loc="upper left")
    if uplink is not None and records:
        end_s = max(r.arrival_s for r in records) + 1.0
        starts_s, mbps = _throughput_over(uplink, uplink_offset_ms, end_s)
        bw = line.twinx()
        bw.step(starts_s, mbps, where="post", color="grey", alpha=0.6)
        bw.plot(
            [r.arrival_s for r in records],
            [r.uplink_estimate_mbps for r in records],
            color="purple",
            lw=1,
            alpha=0.7,
        )
        bw.set_ylabel("uplink Mbit/s (grey: trace, purple: client's estimate)")
    fig.suptitle(title or "client run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _throughput_over(
    trace: LinkTrace, offset_ms: float, end_s: float
) -> tuple[np.ndarray, np.ndarray]:
    starts = np.arange(0.0, end_s, 1.0)
    mbps = np.array(
        [trace.throughput_mbps(offset_ms + 1000 * t, offset_ms + 1000 * (t + 1)) for t in starts]
    )
    return starts, mbps


def plot_sweep(points: Sequence[SweepPoint], path: str | Path, title: str = "") -> None:
    """On-time ratio against the number of clients, one line per offloading mode."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    names = {"none": "server only", "binary": "binary", "partial": "partial"}
    for mode in dict.fromkeys(p.mode for p in points):
        mine = [p for p in points if p.mode == mode]
        ax.plot(
            [p.clients for p in mine],
            [p.summary["on_time_ratio"] for p in mine],
            marker="o",
            label=f"{names.get(mode, mode)} (capacity {capacity(points, mode)})",
        )
    ax.axhline(0.9, color="grey", ls=":", lw=1)
    ax.set_xlabel("clients")
    ax.set_ylabel("on-time ratio")
    ax.set_ylim(0, 1.02)
    ax.legend()
    ax.grid(alpha=0.3)
    ax.set_title(title or "on-time ratio against clients")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""bench/peers.py's output: the table of capacities with layerbatch / best peer, and the plot of
on-time ratio against rate, one line per server."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.peers_crossing import THRESHOLD

TARGET_RATIO = 1.3  # the target: layerbatch's capacity over the best peer's


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def table_rows(
    results: Sequence[dict[str, Any]],
    bounds: Mapping[str, float],
    ceilings: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """One row per (model, deadline, arrival): every server's capacity (its crossing, where
    its result has one) and knobs, the best peer, layerbatch / best peer, each capacity as a
    fraction of the compute bound and in words (`capacity_text`: beyond the rates measured it
    is a bound), and the batched ceiling (`batched_ceiling_rps`) where `ceilings` has it."""
    keys = list(dict.fromkeys((r["model"], r["deadline_ms"], r["arrival"]) for r in results))
    rows = []
    for model, deadline, arrival in keys:
        mine = {
            r["server"]: r
            for r in results
            if (r["model"], r["deadline_ms"], r["arrival"]) == (model, deadline, arrival)
        }
        # from final rounds, the crossing (where bracketed); from a search, its capacity
        caps = {s: mine[s].get("crossing_rps") or mine[s]["capacity_rps"] for s in mine}
        peers = {s: c for s, c in caps.items() if s != "layerbatch"}
        best_peer = max(peers, key=lambda s: peers[s]) if peers else None
        bound = bounds.get(model)
        rows.append(
            {
                "model": model,
                "deadline_ms": deadline,
                "arrival": arrival,
                "compute_bound_rps": round(bound, 2) if bound else None,
                "batched_ceiling_rps": (ceilings or {}).get(model),
                "capacity_rps": caps,
                "capacity_text": {s: capacity_text(mine[s]) for s in mine},
                "knobs": {s: mine[s]["knobs"] for s in mine},
                "fraction_of_bound": {s: ratio(c, bound) for s, c in caps.items()},
                "best_peer": best_peer,
                "layerbatch_over_best_peer": ratio(
                    caps.get("layerbatch"), peers[best_peer] if best_peer else None
                ),
            }
        )
    return rows


def format_table(rows: Sequence[dict[str, Any]], servers: Sequence[str]) -> str:
    head = f"{'model':<13}{'deadline':>9} {'arrival':<8}{'bound':>7}{'ceiling':>8}"
    head += "".join(f"{s:>15}" for s in servers) + f"{'best peer':>12}{'lb/peer':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = f"{r['model']:<13}{r['deadline_ms']:>7g}ms {r['arrival']:<8}"
        line += f"{r['compute_bound_rps'] or 0:>7.1f}{r.get('batched_ceiling_rps') or 0:>8.1f}"
        for s in servers:
            c = r["capacity_rps"].get(s)
            f = r["fraction_of_bound"].get(s)
            text = r.get("capacity_text", {}).get(s, "")
            if text.startswith("below "):
                short = f"<{text.removeprefix('below ')}"
            else:
                short = f"{c or 0:.1f}" + ("+" if text.endswith(" or more") else "")
            line += f"{'-':>15}" if c is None else f"{short:>8} ({f or 0:.2f})"
        lb = r["layerbatch_over_best_peer"]
        line += f"{r['best_peer'] or '-':>12}{'-' if lb is None else f'{lb:.2f}':>9}"
        lines.append(line)
    lines.append(
        "capacity req/s at on-time ratio >= 0.9 (fraction of the compute bound; R+: on time at "
        "every rate up to R, <R: under 0.9 already at R); ceiling: decodes + full-batch forwards"
    )
    return "\n".join(lines)


def capacity_text(row: Mapping[str, Any]) -> str:
    """Where a server's on-time ratio crosses the threshold, in words: the crossing, else its
    capacity; "below R" when it is under the threshold already at the lowest rate measured, "R
    or more" when it never falls under it."""
    if row.get("crossing_rps"):
        return f"{round(row['crossing_rps'], 1):g}"
    rates = sorted(float(r) for r in row.get("runs", {}))
    capacity = float(row["capacity_rps"])
    if rates and capacity < rates[0]:
        return f"below {rates[0]:g}"
    if rates and capacity >= rates[-1]:
        return f"{capacity:g} or more"
    return f"{round(capacity, 1):g}"


def plot(
    results: Sequence[dict[str, Any]],
    bounds: Mapping[str, float],
    path: Path,
    ceilings: Mapping[str, float] | None = None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r["model"], r["deadline_ms"], r["arrival"]) for r in results))
    cols = min(len(panels), 3)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    colors = {"layerbatch": "C3", "triton": "C0", "ray": "C2", "torchserve": "C1"}
    for ax, (model, deadline, arrival) in zip(axes.flat, panels, strict=False):
        highest = 0.0
        for r in results:
            if (r["model"], r["deadline_ms"], r["arrival"]) != (model, deadline, arrival):
                continue
            runs = {**r.get("tuning_runs_at_these_knobs", {}), **r["runs"]}
            pts = sorted((float(k), v["on_time_ratio"] or 0.0) for k, v in runs.items())
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            highest = max(highest, *xs)
            ax.plot(
                xs,
                ys,
                "o-",
                color=colors.get(r["server"]),
                label=f"{r['server']} ({r['knobs']}): {capacity_text(r)}",
            )
        lines = (
            ("compute bound", bounds.get(model), {"color": "grey", "ls": ":"}),
            (
                "batched ceiling",
                (ceilings or {}).get(model),
                {"color": "black", "ls": "-.", "lw": 0.8},
            ),
        )
        for name, rate, style in lines:
            if rate and rate <= 3.0 * highest:
                ax.axvline(rate, label=name, **style)
            elif rate:  # far right of every rate measured (the Azure trace): named, not drawn
                ax.plot([], [], " ", label=f"{name} {rate:.0f} req/s, off the axis")
        ax.axhline(THRESHOLD, color="grey", ls="--", lw=0.8)
        ax.set_title(f"{model}, {deadline:g} ms, {arrival}")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("on-time ratio")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7, loc="lower left")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)

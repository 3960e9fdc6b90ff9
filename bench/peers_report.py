"""The report of --interleave runs (`bench/peers.py --report`): runs of one cell pooled, each
server's crossing, layerbatch / best peer with its interval over the rounds, and the ideal
server's crossing at the batched ceiling."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.peers_arrivals import AZURE_TRACE, FULL_LOAD, arrivals_for
from bench.peers_capacity import SPEED_CHANGE_WARN, speed_warning
from bench.peers_crossing import (
    RULES,
    THRESHOLD,
    capacity_rules,
    edge_crossing,
    ratio_interval,
    threshold_crossing,
)
from bench.peers_ideal import equivalent_ceiling_rps, ideal_crossing_rps
from bench.peers_table import TARGET_RATIO, capacity_text, plot


def mean_on_time(runs: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]]) -> dict[str, Any]:
    """Per server and rate, the mean on-time ratio over the rounds' summaries."""
    return {
        s: {
            r: round(float(np.mean([x["on_time_ratio"] or 0.0 for x in v])), 4)
            for r, v in per.items()
        }
        for s, per in runs.items()
    }


def report_interleaved(doc: dict[str, Any], png: Path, rng: np.random.Generator) -> None:
    """Print an --interleave document's table, crossings, bounds and layerbatch / best peer
    with its interval over the rounds (`bench.peers_crossing`), and plot it to `png`."""
    model = doc["model"]
    rows = interleaved_results(doc)
    bound = float(doc["compute_bound"]["rps"])
    ceiling = doc["compute_bound"].get("batched_rps")  # not measured by the oldest runs
    plot(rows, {model: bound}, png, {model: float(ceiling)} if ceiling else None)
    servers = list(doc["mean_on_time"])
    rates = sorted({float(r) for per in doc["mean_on_time"].values() for r in per})
    print(f"{'rate':>6}" + "".join(f"{s:>12}" for s in servers))
    for rate in rates:
        cells = [doc["mean_on_time"][s].get(f"{rate:g}") for s in servers]
        print(f"{rate:>6g}" + "".join(f"{'-' if v is None else f'{v:.3f}':>12}" for v in cells))
    for row in rows:
        print(f"{row['server']}: crosses {THRESHOLD} at {capacity_text(row)} req/s")
    print(
        f"compute bound {bound:g} req/s, batched ceiling "
        + (f"{ceiling:g} (means of before and after)" if ceiling else "not measured")
    )
    warning = speed_warning(doc["compute_bound"])
    if warning:
        print(warning)
    rounds = rounds_of(doc)
    interval = ratio_interval(rounds, rng)
    if interval is not None:
        print(f"layerbatch / best peer: {interval.text()}")
        read = capacity_rules(rounds)
        print(
            "layerbatch / best peer by the other rules (bench/peers_crossing.py): "
            + ", ".join(f"{rule} {read[rule].ratio:.2f}x" for rule in RULES[1:])
        )
    peers = [v for server, v in crossings(rows).items() if server != "layerbatch"]
    best_peer = max(peers, default=0.0)
    ideal = None
    if ceiling:
        arrivals_at, deadline_ms = run_arrivals(doc), float(doc["deadline_ms"])
        ideal = ideal_crossing_rps(arrivals_at, deadline_ms, float(ceiling))
        # beyond the measured rates a crossing is a bound, and so is its equivalent ceiling
        qualifier = {"above": "at least ", "below": "at most ", "": ""}
        parts = []
        for server, per in doc["mean_on_time"].items():
            rate, side = edge_crossing({float(r): v for r, v in per.items()})
            rps = equivalent_ceiling_rps(arrivals_at, deadline_ms, rate)
            parts.append(
                f"{server} {qualifier[side]}{rps:.1f} ({rps / float(ceiling):.2f} of the ceiling)"
            )
        each = ", ".join(parts)
        crosses = (
            f"crosses {THRESHOLD} at {ideal:.1f} req/s"
            if math.isfinite(ideal)  # else the arrivals fit its deadline however fast they come
            else f"stays at {THRESHOLD} or more at every rate"
        )
        print(
            f"an ideal server at the ceiling (bench/peers_ideal.py) {crosses} under these arrivals"
            + (f"; each server crosses where it would at a ceiling of {each}" if each else "")
        )
    if best_peer:
        target = TARGET_RATIO * best_peer
        share = f": {target / ceiling:.2f} of the ceiling" if ceiling else ""
        if ideal and math.isfinite(ideal):
            share += f", {target / ideal:.2f} of the ideal server's crossing"
        print(f"{TARGET_RATIO:g}x the best peer's {best_peer:g} req/s is {target:.1f}{share}")


def run_arrivals(doc: Mapping[str, Any]) -> Callable[[float], np.ndarray]:
    """An --interleave document's arrivals at any rate: its first round's, regenerated from its
    `load` (runs saved before it recorded one used a full run's, `FULL_LOAD`)."""
    from traces.arrivals import load_timestamps

    load = {**FULL_LOAD, **doc.get("load", {})}
    count = int(load["min_requests"])
    trace = load_timestamps(AZURE_TRACE) if doc["arrival"] != "poisson" else np.empty(0)

    def arrivals_at(rate: float) -> np.ndarray:
        duration_s = max(float(load["duration_s"]), count / rate)
        return np.asarray(
            arrivals_for(doc["arrival"], rate, duration_s, int(load["seed"]), trace, count)
        )

    return arrivals_at


def rounds_of(doc: Mapping[str, Any]) -> dict[str, dict[float, list[float]]]:
    """An --interleave document's on-time ratio of every round, by server and rate."""
    return {
        s: {float(r): [x["on_time_ratio"] or 0.0 for x in v] for r, v in per.items()}
        for s, per in doc["runs"].items()
    }


def pool_interleaved(docs: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Several --interleave documents of one model, deadline and arrival process as one: every
    round of every rate kept, the means over them, the bounds' means. Raises ValueError naming
    the first document that measured something else."""
    first = docs[0]
    cell = ("model", "deadline_ms", "arrival")
    for doc, name in zip(docs, names, strict=True):
        if any(doc.get(k) != first.get(k) for k in cell):
            raise ValueError(
                f"{name}: measured {doc.get('model')} at {doc.get('deadline_ms'):g} ms under "
                f"{doc.get('arrival')} arrivals, expected the first file's {first.get('model')} at "
                f"{first.get('deadline_ms'):g} ms under {first.get('arrival')}"
            )
    if len(docs) == 1:
        return dict(first)
    runs: dict[str, dict[str, list[Any]]] = {}
    for doc in docs:
        for server, per in doc["runs"].items():
            for rate, rounds in per.items():
                runs.setdefault(server, {}).setdefault(rate, []).extend(rounds)
    bounds = [d["compute_bound"] for d in docs]
    return {
        **first,
        "rounds": "/".join(str(r) for r in dict.fromkeys(d["rounds"] for d in docs)),
        "pooled_runs": len(docs),
        "runs": runs,
        "mean_on_time": mean_on_time(runs),
        "compute_bound": {  # each run's own, and their means (the speed warnings are per run)
            "runs": bounds,
            "rps": round(float(np.mean([b["rps"] for b in bounds])), 2),
            "batched_rps": round(float(np.mean([b["batched_rps"] for b in bounds])), 2)
            if all(b.get("batched_rps") for b in bounds)
            else None,
        },
    }


def load_interleaved(path: Path) -> dict[str, Any]:
    """A saved --interleave document. Raises ValueError naming `path` when it cannot be read or
    is not one."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: expected an --interleave JSON file ({exc})") from None
    if not isinstance(doc, dict) or "runs" not in doc or "mean_on_time" not in doc:
        raise ValueError(f"{path}: expected an --interleave JSON file (no runs by rate)")
    return doc


def report_main(paths: Sequence[Path], png: Path, seed: int) -> None:
    """`--report`: the runs in `paths` pooled, reported as after an --interleave run."""
    try:
        docs = [load_interleaved(path) for path in paths]
        doc = pool_interleaved(docs, [str(p) for p in paths])
    except ValueError as exc:
        raise SystemExit(f"--report: {exc}") from None
    print(f"{doc['model']}, {doc['deadline_ms']:g} ms, {doc.get('arrival', 'poisson')}: "
          f"{', '.join(p.name for p in paths)}")  # fmt: skip
    for path, one in zip(paths, docs, strict=True):
        warning = speed_warning(one["compute_bound"]) if len(docs) > 1 else None
        if warning:
            print(f"{path.name}: {warning}")
    ceilings = [d["compute_bound"].get("batched_rps") or 0.0 for d in docs]
    if min(ceilings) > 0 and max(ceilings) / min(ceilings) > 1.0 + SPEED_CHANGE_WARN:
        print(
            f"warning: these runs' batched ceilings differ ({min(ceilings):.1f} to "
            f"{max(ceilings):.1f} req/s): pooled, their rounds mix machine speeds, so read each "
            "run on its own as well"
        )
    report_interleaved(doc, png, np.random.default_rng(seed))
    if len(docs) > 1:
        for line in pooled_support(docs, doc):
            print(line)
    print(f"wrote {png}")


def pooled_support(docs: Sequence[Mapping[str, Any]], pooled: Mapping[str, Any]) -> list[str]:
    """Per server, what each run read alone, and a warning where the pooled crossing lies
    outside some runs' rates: the pooled mean there averages only the runs that measured it, so
    a run whose rates all lie above a server's crossing moves nothing below them (resnet18 at
    300 ms: two of four runs had both peers under 0.9 at their lowest rate, and a fifth run that
    bracketed the crossings moved TorchServe's pooled one from 87.8 to 94.6, session 83)."""
    lines = []
    for server, per in pooled["mean_on_time"].items():
        at, _ = edge_crossing({float(r): v for r, v in per.items()})
        alone, outside = [], 0
        for doc in docs:
            mine = {float(r): v for r, v in doc["mean_on_time"].get(server, {}).items()}
            if not mine:
                continue
            rate, side = edge_crossing(mine)
            alone.append({"": f"{rate:g}", "below": f"below {rate:g}", "above": f"{rate:g}+"}[side])
            outside += not min(mine) <= at <= max(mine)
        lines.append(f"{server}, each run alone: {', '.join(alone)}")
        if outside:
            lines.append(
                f"warning: {server}'s pooled crossing ({at:g} req/s) lies outside the rates of "
                f"{outside} of {len(alone)} runs; there it rests on the other "
                f"{len(alone) - outside}"
            )
    return lines


def rounds_text(doc: Mapping[str, Any]) -> str:
    """How many rounds a result holds, in words: "2 rounds interleaved", or for runs pooled by
    `--report`, "5 runs pooled"."""
    runs = doc.get("pooled_runs", 1)
    if runs > 1:
        return f"{runs} runs pooled"
    return f"{doc['rounds']} rounds interleaved"


def crossings(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each server's crossing of the threshold, or its capacity where no crossing was bracketed."""
    return {r["server"]: r["crossing_rps"] or r["capacity_rps"] for r in rows}


def interleaved_results(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """An --interleave document as `plot`'s results: per server, the mean on-time ratio over
    the rounds at each rate, and as `capacity_rps` and `crossing_rps` the two of
    `threshold_crossing` over those means."""
    out = []
    for server, per in doc["mean_on_time"].items():
        capacity, crossing = threshold_crossing({float(r): v for r, v in per.items()})
        label = doc["knobs"][server] + (", folded" if doc.get("fold_peers") else "")
        out.append(
            {
                "server": server,
                "model": doc["model"],
                "deadline_ms": doc["deadline_ms"],
                "arrival": f"{doc.get('arrival', 'poisson')}, {rounds_text(doc)}",
                "knobs": label if server != "layerbatch" else doc["knobs"][server],
                "capacity_rps": capacity,
                "crossing_rps": crossing,
                "runs": {r: {"on_time_ratio": v} for r, v in per.items()},
            }
        )
    return out

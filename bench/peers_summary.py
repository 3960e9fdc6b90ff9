"""The README's table of layerbatch against its peers, computed from the runs behind each cell
(issue 9), and the cells' notes beside it.

`bench/results/peers-cells.json` names, for each model, deadline and arrival process, the
`bench/peers.py --interleave` runs the README reports. Each cell's runs are pooled as `--report`
pools them (every round of every rate kept), and its row gives:

- the compute bound and the batched ceiling, each run's own (means of the measurements before and
  after it), as `bench/peers.py` defines them;
- where layerbatch and the best peer cross THRESHOLD on time (req/s), interpolated between the
  mean on-time ratios of the measured rates ("R or more" when a server never fell under it, "below
  R" when it was under it at the lowest rate);
- layerbatch / best peer with the central 90% of its bootstrap over the rounds, and "at least" or
  "at most" where a crossing lies beyond the measured rates (`bench/peers_crossing.py`);
- the target, TARGET_RATIO x the best peer: **met** when the ratio, or its lower bound, reaches it;
  **not met** when the ratio, or its upper bound, falls short; **open** when the runs cannot say
  (a lower bound under the target, or neither server crossing within the rates);
- layerbatch's crossing over the compute bound (the issue's other target: at least 0.85).

The README quotes the table; a cell with a note is numbered in its target column, and the notes
(what its runs showed, and its earlier runs) follow the same table in `--md`,
`bench/results/peers-cells.md`. The picture (`--png`) shows each cell's ratio and interval
against the target. Runs in any venv with numpy and matplotlib (no server starts):

    .venv/bin/python bench/peers_summary.py [--cells FILE] [--png FILE] [--md FILE] [--seed 1]

`--grid bench/results/peers-full.json` prints instead the table of a finished `make bench-peers`
grid (the one in bench/results/peers-grid.md), from the rows its JSON keeps (`table`), in the
same terms.

`--rules FILE[,FILE...]` prints, per cell, layerbatch / best peer by each capacity rule of
`bench/peers_crossing.capacity_rules`: the benchmark's first crossing, the highest rate on time,
and the crossing of a monotone fit. FILE is a finished grid's JSON (every cell of it) or
`--interleave` runs of one cell (pooled as `--report` pools them).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: the repository root, for `bench.peers`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.peers_arrivals import FULL_LOAD
from bench.peers_crossing import (
    RULES,
    THRESHOLD,
    RatioInterval,
    Rounds,
    best_server,
    capacity_rules,
    edge_crossing,
    ratio_interval,
)
from bench.peers_report import load_interleaved, pool_interleaved, rounds_of
from bench.peers_table import TARGET_RATIO

RESULTS = Path(__file__).resolve().parent / "results"
CELLS = RESULTS / "peers-cells.json"
RUN_PREFIX = "peers-interleaved-"
SERVER_NAMES = {"triton": "Triton", "torchserve": "TorchServe", "ray": "Ray Serve"}
ARRIVAL_NAMES = {"poisson": "Poisson", "azure": "Azure trace"}


@dataclass(frozen=True)
class Cell:
    """One model, deadline and arrival process, from its runs pooled."""

    model: str
    deadline_ms: float
    arrival: str
    runs: tuple[str, ...]  # file names
    dates: tuple[str, ...]
    compute_bound_rps: tuple[float, ...]  # each run's
    batched_ceiling_rps: tuple[float | None, ...]  # each run's (None: not measured)
    ours: tuple[float, str]  # layerbatch's crossing and its side (`edge_crossing`)
    our_knobs: str  # layerbatch's: "default" (one runtime) or "2 replicas"
    best_peer: str
    best_peer_knobs: str
    peer: tuple[float, str]  # the best peer's crossing and its side
    interval: RatioInterval
    note: str = ""  # from the cells file: what the runs showed
    history: str = ""  # from the cells file: what the note said of the cell's earlier runs

    @property
    def status(self) -> str:
        """met, not met or open (module docstring)."""
        return target_status(self.interval)

    def of_compute_bound(self) -> tuple[float, str] | None:
        """layerbatch's crossing over the mean compute bound, and its side; None under a trace,
        whose rate is the trace's mean rate and no measure of the work (its bursts come at the
        same pace whatever the rate)."""
        if self.arrival != "poisson":
            return None
        return self.ours[0] / float(np.mean(self.compute_bound_rps)), self.ours[1]


def target_status(iv: RatioInterval) -> str:
    """met, not met or open (module docstring)."""
    if iv.bound.startswith("beyond"):
        return "open"
    if iv.ratio >= TARGET_RATIO:
        return "not met" if iv.bound == "at most" else "met"
    return "open" if iv.bound == "at least" else "not met"


def crossings_of(means: Mapping[str, Mapping[str, float]]) -> dict[str, tuple[float, str]]:
    """Each server's `edge_crossing` of its mean on-time ratios (rates as the JSON keys them)."""
    return {s: edge_crossing({float(r): v for r, v in per.items()}) for s, per in means.items()}


def cell_of(
    docs: Sequence[Mapping[str, Any]],
    names: Sequence[str],
    seed: int,
    note: str = "",
    history: str = "",
) -> Cell:
    """One cell from its runs (`pool_interleaved` checks they measured the same cell)."""
    doc = pool_interleaved(docs, names)
    at = crossings_of(doc["mean_on_time"])
    peers = {s: v for s, v in at.items() if s != "layerbatch"}
    if "layerbatch" not in at or not peers:
        raise ValueError(f"{', '.join(names)}: expected layerbatch and a peer among the servers")
    peer = best_server(peers)
    interval = ratio_interval(rounds_of(doc), np.random.default_rng(seed))
    assert interval is not None  # layerbatch and a peer are there
    bounds = [d["compute_bound"] for d in docs]
    return Cell(
        model=doc["model"],
        deadline_ms=float(doc["deadline_ms"]),
        arrival=doc.get("arrival", "poisson"),
        runs=tuple(names),
        dates=tuple(str(d.get("date", "")) for d in docs),
        compute_bound_rps=tuple(float(b["rps"]) for b in bounds),
        batched_ceiling_rps=tuple(
            float(b["batched_rps"]) if b.get("batched_rps") else None for b in bounds
        ),
        ours=at["layerbatch"],
        our_knobs="; ".join(dict.fromkeys(d["knobs"].get("layerbatch", "default") for d in docs)),
        best_peer=peer,
        best_peer_knobs="; ".join(
            dict.fromkeys(d["knobs"][peer] for d in docs if peer in d["knobs"])
        ),
        peer=at[peer],
        interval=interval,
        note=note,
        history=history,
    )


def load_cells(path: Path, seed: int) -> list[Cell]:
    """Every cell of a cells file: {"cells": [{"runs": [file names in its folder], "note":
    optional text, "history": optional text (what the note said of the cell's earlier runs)},
    ...]}. Raises ValueError with one sentence naming what is wrong."""
    try:
        spec = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: expected a JSON cells file ({exc})") from None
    entries = spec.get("cells") if isinstance(spec, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(
            f'{path}: expected {{"cells": [{{"runs": [...]}}, ...]}} with one cell or more'
        )
    cells = []
    for i, entry in enumerate(entries):
        names = entry.get("runs") if isinstance(entry, dict) else None
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ValueError(f'{path}: cell {i}: expected "runs", a list of run file names')
        for key in ("note", "history"):
            if not isinstance(entry.get(key, ""), str):
                raise ValueError(f'{path}: cell {i}: expected "{key}" to be text')
        docs = [load_interleaved(path.parent / name) for name in names]
        cells.append(cell_of(docs, names, seed, entry.get("note", ""), entry.get("history", "")))
    return cells


def crossing_text(value: float, side: str) -> str:
    """A crossing as the table gives it: "46.5", "15 or more", "below 10"."""
    text = f"{round(value, 1):g}"
    return {"above": f"{text} or more", "below": f"below {text}"}.get(side, text)


def ratio_text(iv: RatioInterval) -> str:
    if iv.bound.startswith("beyond"):
        return "none: neither crossed within the rates"
    prefix = f"{iv.bound} " if iv.bound else ""
    return f"{prefix}{iv.ratio:.2f}x ({iv.low:.2f}-{iv.high:.2f}x)"


def share_text(share: tuple[float, str] | None) -> str:
    if share is None:
        return "n/a (trace)"
    prefix = {"above": "at least ", "below": "at most "}.get(share[1], "")
    return f"{prefix}{share[0]:.2f}"


def run_names(runs: Sequence[str]) -> str:
    return ", ".join(f"`{n.removeprefix(RUN_PREFIX).removesuffix('.json')}`" for n in runs)


def numbers(values: Sequence[float | None]) -> str:
    return "; ".join("-" if v is None else f"{v:.1f}" for v in values)


def table(cells: Sequence[Cell]) -> str:
    """The README's markdown table, one row per cell; a cell with a note carries its number (as
    `notes` numbers them) in its target column."""
    head = (
        "| model | deadline, arrivals | compute bound | batched ceiling | layerbatch | best peer "
        f"| layerbatch / best peer (90% interval) | {TARGET_RATIO:g}x target "
        "| layerbatch / compute bound | runs (`bench/results/peers-interleaved-*.json`) |"
    )
    rows: list[str] = [head, "|" + "---|" * 10]
    noted = 0
    for c in cells:
        target = f"**{c.status}**" if c.status == "met" else c.status
        if c.note:
            noted += 1
            target += f" ({noted})"
        name = SERVER_NAMES.get(c.best_peer, c.best_peer)
        peer = f"{name} ({c.best_peer_knobs}) {crossing_text(*c.peer)}"
        ours = crossing_text(*c.ours)
        if c.our_knobs != "default":
            ours += f" ({c.our_knobs})"
        rows.append(
            f"| {c.model} | {c.deadline_ms:g} ms, {ARRIVAL_NAMES.get(c.arrival, c.arrival)} "
            f"| {numbers(c.compute_bound_rps)} | {numbers(c.batched_ceiling_rps)} "
            f"| {ours} | {peer} | {ratio_text(c.interval)} | {target} "
            f"| {share_text(c.of_compute_bound())} | {run_names(c.runs)} |"
        )
    return "\n".join(rows)


def grid_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The markdown table of a finished `bench/peers.py` grid (bench/results/peers-grid.md), from
    the `table` of its JSON: per cell the compute bound and batched ceiling, every server's
    crossing with its knobs (the best peer's in bold), layerbatch / best peer with its interval,
    and the target's status as the cells' table gives it."""
    servers = list(dict.fromkeys(s for r in rows for s in r["capacity_rps"]))
    head = (
        "| model | deadline, arrivals | compute bound | batched ceiling | "
        + "".join(f"{SERVER_NAMES.get(s, s)} | " for s in servers)
        + f"layerbatch / best peer (90% interval) | {TARGET_RATIO:g}x target |"
    )
    lines = [head, "|" + "---|" * (len(servers) + 6)]
    for r in rows:
        arrival = ARRIVAL_NAMES.get(r["arrival"], r["arrival"])
        line = (
            f"| {r['model']} | {r['deadline_ms']:g} ms, {arrival} "
            f"| {numbers([r['compute_bound_rps']])} | {numbers([r['batched_ceiling_rps']])} |"
        )
        for s in servers:
            text = r["capacity_text"].get(s, "-")
            knobs = r["knobs"].get(s)
            text = f"**{text}**" if s == r["best_peer"] else text
            line += f" {text} ({'one runtime' if knobs == 'default' else knobs}) |"
        found = r.get("layerbatch_over_best_peer_interval")
        if found is None:
            lines.append(line + " - | - |")
            continue
        iv = RatioInterval(**found)
        status = target_status(iv)
        lines.append(
            line + f" {ratio_text(iv)} | {f'**{status}**' if status == 'met' else status} |"
        )
    return "\n".join(lines)


def read_json(path: Path, flag: str) -> Any:
    """The JSON in `path`; ValueError naming the flag and the file when it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{flag} {path}: cannot read it as JSON ({exc})") from None


def load_grid(path: Path) -> list[dict[str, Any]]:
    """The `table` of a finished `bench/peers.py` run's JSON; ValueError naming what is wrong."""
    doc = read_json(path, "--grid")
    if not isinstance(doc, dict) or not isinstance(doc.get("table"), list):
        raise ValueError(
            f'--grid {path}: no "table" in it; expected the JSON a finished bench/peers.py run '
            "writes (a .partial.json is not finished: continue it with --resume)"
        )
    table: list[dict[str, Any]] = doc["table"]
    return table


def rule_cases(paths: Sequence[Path]) -> list[tuple[str, Rounds]]:
    """(cell name, every server's rounds by rate) from a finished grid's JSON, one per complete
    case of its `finals`, or from `--interleave` runs of one cell, pooled. Raises ValueError
    naming the file that is neither."""
    if not paths:
        raise ValueError("--rules: expected a file name, or several separated by commas")
    docs = [read_json(path, "--rules") for path in paths]
    if len(docs) == 1 and isinstance(docs[0], dict) and isinstance(docs[0].get("finals"), list):
        finals = docs[0]["finals"]
        return [(case_name(r), rounds_of(r)) for r in finals if r.get("complete")]
    for path, doc in zip(paths, docs, strict=True):
        if not isinstance(doc, dict) or "runs" not in doc or "mean_on_time" not in doc:
            raise ValueError(
                f"--rules {path}: expected a finished bench/peers.py grid's JSON (with "
                '"finals") or --interleave runs of one cell'
            )
    doc = pool_interleaved(docs, [str(p) for p in paths])
    return [(case_name(doc), rounds_of(doc))]


def rules_table(cases: Sequence[tuple[str, Rounds]]) -> str:
    """A markdown table: per cell, layerbatch's capacity over the best peer's by each of RULES
    (`capacity_rules`), the best peer named under each."""
    lines = ["| cell | " + " | ".join(RULES) + " |", "|" + "---|" * (len(RULES) + 1)]
    for name, rounds in cases:
        read = capacity_rules(rounds)
        if not read:
            lines.append(f"| {name} |" + " - |" * len(RULES))
            continue
        cells = (
            f"{crossing_text(*r.ours)} / {SERVER_NAMES.get(r.best_peer, r.best_peer)} "
            f"{crossing_text(*r.peer)} = {r.ratio:.2f}x"
            for r in (read[rule] for rule in RULES)
        )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def notes(cells: Sequence[Cell]) -> str:
    """The noted cells' notes, numbered as `table` numbers them, each with its history."""
    items: list[str] = []
    for c in (c for c in cells if c.note):
        earlier = f"\n\n   *Earlier runs.* {c.history}" if c.history else ""
        items.append(f"{len(items) + 1}. {cell_name(c)}: {c.note}{earlier}")
    return "\n".join(items)


def report(cells: Sequence[Cell], cells_file: str) -> str:
    """`bench/results/peers-cells.md`: the table and the notes, generated from the cells file."""
    return (
        f"# layerbatch against its peers, cell by cell\n\nGenerated by `bench/peers_summary.py` "
        f"from `{cells_file}`; edit that file, not this one. Runs, rounds and what each change "
        "found: `peers-log.md`.\n\n" + table(cells) + "\n\n" + notes(cells) + "\n"
    )


def cell_name(c: Cell) -> str:
    return case_name({"model": c.model, "deadline_ms": c.deadline_ms, "arrival": c.arrival})


def case_name(case: Mapping[str, Any]) -> str:
    """A case's name from its model, deadline and arrivals, as in "resnet18, 300 ms, Poisson"."""
    arrival = case.get("arrival", "poisson")
    return f"{case['model']}, {case['deadline_ms']:g} ms, {ARRIVAL_NAMES.get(arrival, arrival)}"


STATUS_COLOURS = {"met": "tab:green", "not met": "tab:red", "open": "tab:gray"}


def plot(cells: Sequence[Cell], path: Path) -> None:
    """Each cell's ratio (dot) and 90% interval (bar), coloured by status; an arrow marks a
    bound, a hollow dot a cell where neither server crossed; lines at 1x and at the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.42 * len(cells) + 1.6))
    for y, c in enumerate(reversed(cells)):
        iv, colour = c.interval, STATUS_COLOURS[c.status]
        ax.plot([iv.low, iv.high], [y, y], color=colour, lw=3, alpha=0.45, solid_capstyle="butt")
        if iv.bound.startswith("beyond"):
            ax.plot([iv.ratio], [y], "o", mfc="white", color=colour, ms=8)
            ax.annotate("neither crossed", (iv.ratio, y), xytext=(8, -3),
                        textcoords="offset points", fontsize=8, color=colour)  # fmt: skip
            continue
        marker = {"at least": ">", "at most": "<"}.get(iv.bound, "o")
        ax.plot([iv.ratio], [y], marker=marker, color=colour, ms=8, ls="")
    ax.axvline(1.0, color="black", lw=0.8)
    ax.axvline(TARGET_RATIO, color="tab:green", lw=1, ls="--")
    ax.set_yticks(range(len(cells)))
    ax.set_yticklabels([cell_name(c) for c in reversed(cells)])
    ax.set_xlabel(f"layerbatch's capacity / the best peer's (capacity: {THRESHOLD:g} on time)")
    dates = sorted({d for c in cells for d in c.dates if d})
    span = f"{dates[0]} to {dates[-1]}" if len(dates) > 1 else (dates[0] if dates else "")
    ax.set_title(f"layerbatch against its best peer, runs of {span}", fontsize=10)
    for status, colour in STATUS_COLOURS.items():
        ax.plot([], [], "o", color=colour, label=status)
    ax.plot([], [], ">", color="black", label="a bound (beyond the rates)")
    ax.plot([], [], lw=3, alpha=0.45, color="black", label="90% interval over rounds")
    ax.plot([], [], ls="--", color="tab:green", label=f"target {TARGET_RATIO:g}x")
    ax.legend(loc="upper center", bbox_to_anchor=(0.4, -0.09), ncol=3, fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", type=Path, default=CELLS, help="the cells file (module docstring)")
    ap.add_argument("--png", type=Path, default=RESULTS / "peers-summary.png")
    ap.add_argument("--md", type=Path, default=RESULTS / "peers-cells.md", help="table and notes")
    ap.add_argument("--seed", type=int, default=int(FULL_LOAD["seed"]), help="the bootstrap's")
    ap.add_argument(
        "--grid",
        type=Path,
        help="print the table of a finished bench/peers.py run (its JSON) instead",
    )
    ap.add_argument(
        "--rules",
        help="print layerbatch / best peer by each capacity rule instead (module docstring): "
        "a finished grid's JSON, or --interleave runs of one cell, comma-separated",
    )
    a = ap.parse_args(argv)
    if a.rules is not None:
        try:
            print(rules_table(rule_cases([Path(p) for p in a.rules.split(",") if p])))
        except ValueError as exc:
            raise SystemExit(f"peers_summary: {exc}") from None
        return
    if a.grid is not None:
        try:
            print(grid_table(load_grid(a.grid)))
        except ValueError as exc:
            raise SystemExit(f"peers_summary: {exc}") from None
        return
    try:
        cells = load_cells(a.cells, a.seed)
    except ValueError as exc:
        raise SystemExit(f"peers_summary: {exc}") from None
    print(table(cells))
    a.md.write_text(report(cells, a.cells.name))
    plot(cells, a.png)
    print(f"wrote {a.md} and {a.png}")


if __name__ == "__main__":
    main()

"""bench/peers_summary.py: the README's peers table from the runs behind each cell."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from bench.peers_arrivals import ROOT
from bench.peers_crossing import capacity_rules
from bench.peers_report import mean_on_time
from bench.peers_summary import (
    CELLS,
    grid_table,
    load_cells,
    load_grid,
    main,
    notes,
    report,
    rule_cases,
    rules_table,
    table,
)
from bench.peers_table import TARGET_RATIO


def run_doc(
    rounds: Mapping[str, Mapping[float, Sequence[float]]],
    model: str = "resnet18",
    arrival: str = "poisson",
    rps: float = 40.0,
    date: str = "2026-11-25",
) -> dict[str, Any]:
    """An --interleave document with these on-time ratios per server, rate and round."""
    runs = {
        s: {f"{r:g}": [{"on_time_ratio": v} for v in vs] for r, vs in per.items()}
        for s, per in rounds.items()
    }
    return {
        "date": date,
        "model": model,
        "deadline_ms": 300,
        "arrival": arrival,
        "rounds": 2,
        "knobs": {s: "default" if s == "layerbatch" else "B=8,5ms" for s in rounds},
        "runs": runs,
        "mean_on_time": mean_on_time(runs),
        "compute_bound": {"rps": rps, "batched_rps": 56.0},
    }


def write_cells(
    tmp_path: Path, cells: Sequence[Mapping[str, Any]], docs: Mapping[str, Any]
) -> Path:
    for name, doc in docs.items():
        (tmp_path / name).write_text(json.dumps(doc))
    path = tmp_path / "cells.json"
    path.write_text(json.dumps({"cells": list(cells)}))
    return path


# layerbatch crosses 0.9 at 15 req/s in every case below
OURS = {10.0: [1.0, 1.0], 20.0: [0.8, 0.8]}


def test_a_cell_meets_the_target_when_layerbatch_crosses_at_least_1_3x_the_best_peer(
    tmp_path: Path,
) -> None:
    doc = run_doc({"layerbatch": OURS, "triton": {10.0: [0.95, 0.95], 20.0: [0.5, 0.5]},
                   "torchserve": {10.0: [0.2, 0.2], 20.0: [0.1, 0.1]}})  # fmt: skip
    path = write_cells(tmp_path, [{"runs": ["a.json"]}], {"a.json": doc})
    (cell,) = load_cells(path, seed=1)
    assert cell.best_peer == "triton"  # torchserve under 0.9 at once counts at 10, below 11.1
    assert cell.interval.ratio == pytest.approx(15.0 / 11.1)
    assert cell.status == "met"
    row = table([cell]).splitlines()[2]
    assert "| 15 | Triton (B=8,5ms) 11.1 | 1.35x (1.35-1.35x) | **met** | 0.38 |" in row


def test_a_bound_decides_the_status_only_on_the_side_it_bounds(tmp_path: Path) -> None:
    held = {10.0: [1.0, 1.0], 20.0: [0.95, 0.95]}  # never under 0.9: 20 or more
    docs = {
        # layerbatch held to 20, the peer crossed at 16.7: at least 1.20x, short of the target
        "open.json": run_doc({"layerbatch": held, "triton": {10.0: [1.0, 1.0], 20.0: [0.85]}}),
        # the peer held to 20, layerbatch crossed at 15: at most 0.75x
        "short.json": run_doc({"layerbatch": OURS, "triton": held}),
        # both held: no ratio
        "level.json": run_doc({"layerbatch": held, "triton": held}, arrival="azure"),
    }
    cells_file = [{"runs": [n]} for n in docs]
    opened, short, level = load_cells(write_cells(tmp_path, cells_file, docs), seed=1)
    assert (opened.interval.bound, opened.status) == ("at least", "open")
    assert (short.interval.bound, short.status) == ("at most", "not met")
    assert level.status == "open"
    rows = table([opened, short, level]).splitlines()
    assert "| 20 or more |" in rows[2] and "| at least 1.20x" in rows[2]
    assert "| at least 0.50 |" in rows[2]  # 20 or more over a compute bound of 40
    assert "| at most 0.75x" in rows[3]
    assert "| none: neither crossed within the rates | open | n/a (trace) |" in rows[4]


def test_a_cells_runs_are_pooled_and_its_note_numbered_beside_the_table(tmp_path: Path) -> None:
    peer = {10.0: [0.95], 20.0: [0.5]}
    docs = {
        "a.json": run_doc({"layerbatch": {10.0: [1.0], 20.0: [0.9]}, "triton": peer}, rps=40.0),
        "b.json": run_doc({"layerbatch": {10.0: [1.0], 20.0: [0.7]}, "triton": peer}, rps=44.0),
    }
    path = write_cells(
        tmp_path,
        [
            {"runs": ["a.json"]},
            {"runs": ["a.json", "b.json"], "note": "two runs.", "history": "one run before."},
        ],
        docs,
    )
    plain, cell = load_cells(path, seed=1)
    assert cell.ours == (15.0, "")  # the rounds' mean at 20 is 0.8
    assert cell.compute_bound_rps == (40.0, 44.0)
    text = table([plain, cell])
    assert "| 40.0; 44.0 | 56.0; 56.0 |" in text and "**met** (1) |" in text
    assert text.count("(1)") == 1 and "(2)" not in text  # the cell without a note has no number
    assert notes([plain, cell]) == (
        "1. resnet18, 300 ms, Poisson: two runs.\n\n   *Earlier runs.* one run before."
    )
    report_text = report([plain, cell], "cells.json")
    assert text in report_text and report_text.endswith(notes([plain, cell]) + "\n")


@pytest.mark.parametrize(
    ("cells_text", "files", "expected"),
    [
        ("not json", {}, "expected a JSON cells file"),
        ('{"cells": []}', {}, "with one cell or more"),
        ('{"cells": [{"runs": "a.json"}]}', {}, 'cell 0: expected "runs", a list'),
        ('{"cells": [{"runs": ["missing.json"]}]}', {}, "missing.json: expected an --interleave"),
        ('{"cells": [{"runs": ["a.json"]}]}', {"a.json": {"x": 1}}, "no runs by rate"),
        ('{"cells": [{"runs": ["a.json"], "note": 3}]}', {"a.json": None}, '"note" to be text'),
        (
            '{"cells": [{"runs": ["a.json"], "history": []}]}',
            {"a.json": None},
            '"history" to be text',
        ),
        (
            '{"cells": [{"runs": ["a.json", "b.json"]}]}',
            {"a.json": None, "b.json": {"model": "googlenet"}},
            "measured googlenet at 300 ms",
        ),
    ],
)
def test_a_bad_cells_file_is_refused_with_what_was_expected(
    tmp_path: Path, cells_text: str, files: Mapping[str, Any], expected: str
) -> None:
    good = run_doc({"layerbatch": OURS, "triton": OURS})
    for name, content in files.items():
        doc = good if content is None else ({**good, **content} if "model" in content else content)
        (tmp_path / name).write_text(json.dumps(doc))
    path = tmp_path / "cells.json"
    path.write_text(cells_text)
    with pytest.raises(ValueError, match=expected):
        load_cells(path, seed=1)
    with pytest.raises(SystemExit, match="peers_summary: .*" + expected):
        main(["--cells", str(path), "--png", str(tmp_path / "x.png")])


def test_the_readme_quotes_the_table_its_runs_give(tmp_path: Path) -> None:
    cells = load_cells(CELLS, seed=1)
    names = {(c.model, c.deadline_ms, c.arrival) for c in cells}
    assert len(names) == len(cells) == 12  # 3 models x 2 deadlines x 2 arrival processes
    # re-run peers_summary.py if either is stale
    assert table(cells) + "\n\n" in (ROOT / "README.md").read_text()
    assert (CELLS.parent / "peers-cells.md").read_text() == report(cells, CELLS.name)
    png, md = tmp_path / "summary.png", tmp_path / "cells.md"
    main(["--png", str(png), "--md", str(md)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert md.read_text() == report(cells, CELLS.name)


def grid_row(**over: Any) -> dict[str, Any]:
    """One row of a finished bench/peers.py run's `table`, as peers_table.table_rows gives it."""
    row: dict[str, Any] = {
        "model": "resnet18",
        "deadline_ms": 300.0,
        "arrival": "azure",
        "compute_bound_rps": 23.37,
        "batched_ceiling_rps": 33.38,
        "capacity_rps": {"layerbatch": 40.0, "triton": 30.0, "torchserve": 31.0},
        "capacity_text": {"layerbatch": "40 or more", "triton": "30", "torchserve": "31"},
        "knobs": {"layerbatch": "default", "triton": "B=4,5ms", "torchserve": "B=8,5ms,2w"},
        "best_peer": "torchserve",
        "layerbatch_over_best_peer_interval": {
            "ratio": 40 / 31,
            "low": 1.2,
            "high": 1.4,
            "level": 0.9,
            "draws": 2000,
            "bound": "at least",
        },
    }
    return {**row, **over}


def test_the_grid_table_names_every_server_and_bolds_the_best_peer() -> None:
    text = grid_table([grid_row(), grid_row(model="googlenet", best_peer="triton")])
    head, rule, first, second = text.split("\n")
    assert head.count("|") == rule.count("|") == first.count("|") == 10  # 9 columns
    assert "| layerbatch | Triton | TorchServe |" in head  # in the order the rows give them
    assert "| 300 ms, Azure trace | 23.4 | 33.4 | 40 or more (one runtime) |" in first
    assert "| 30 (B=4,5ms) | **31** (B=8,5ms,2w) |" in first
    # a lower bound under the target leaves the target open, as in the cells' table
    assert first.endswith("| at least 1.29x (1.20-1.40x) | open |")
    assert "| **30** (B=4,5ms) | 31 (B=8,5ms,2w) |" in second


def test_the_grid_table_marks_a_cell_met_or_not_and_one_without_an_interval() -> None:
    met = {"ratio": 1.5, "low": 1.1, "high": 1.9, "level": 0.9, "draws": 2000, "bound": ""}
    rows = [
        grid_row(layerbatch_over_best_peer_interval=met),
        grid_row(layerbatch_over_best_peer_interval={**met, "ratio": 1.2}),
        grid_row(layerbatch_over_best_peer_interval=None),
    ]
    lines = grid_table(rows).split("\n")[2:]
    assert lines[0].endswith("| 1.50x (1.10-1.90x) | **met** |")
    assert lines[1].endswith("| 1.20x (1.10-1.90x) | not met |")
    assert lines[2].endswith("| - | - |")


def test_the_grid_page_quotes_the_grid_its_json_gives(capsys: pytest.CaptureFixture[str]) -> None:
    grid = CELLS.parent / "peers-full.json"
    rows = load_grid(grid)
    assert len(rows) == 12  # 3 models x 2 deadlines x 2 arrival processes
    # re-run `bench/peers_summary.py --grid bench/results/peers-full.json` if peers-grid.md is stale
    assert grid_table(rows) + "\n\n" in (CELLS.parent / "peers-grid.md").read_text()
    main(["--grid", str(grid)])
    assert capsys.readouterr().out == grid_table(rows) + "\n"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "cannot read it as JSON"),
        ("not json", "cannot read it as JSON"),
        ('{"results": []}', 'no "table" in it; expected the JSON a finished bench/peers.py'),
        ("[1, 2]", 'no "table" in it'),
    ],
)
def test_a_file_that_is_no_finished_grid_is_refused(
    tmp_path: Path, content: str | None, expected: str
) -> None:
    path = tmp_path / "peers.partial.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit, match="peers_summary: --grid .*" + expected):
        main(["--grid", str(path)])


def test_the_rules_table_reads_a_grid_cell_by_cell_and_pooled_runs_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = json.loads((CELLS.parent / "peers-full.json").read_text())
    cases = rule_cases([CELLS.parent / "peers-full.json"])
    assert len(cases) == len(grid["table"]) == 12
    first = rules_table(cases).splitlines()[2]
    assert first.startswith("| resnet18, 300 ms, Poisson | 34 / TorchServe 32.7 = 1.04x |")
    # two runs of one cell: pooled, layerbatch reads 0.88 at 20 req/s and 0.94 at 30
    a = run_doc(
        {"layerbatch": {10.0: [1.0], 20.0: [0.8], 30.0: [0.95], 40.0: [0.4]}, "triton": OURS}
    )
    b = run_doc(
        {"layerbatch": {10.0: [1.0], 20.0: [0.96], 30.0: [0.93], 40.0: [0.4]}, "triton": OURS}
    )
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    main(["--rules", f"{tmp_path / 'a.json'},{tmp_path / 'b.json'}"])
    row = capsys.readouterr().out.splitlines()[2]
    # the first crossing falls at the dip; the monotone fit merges 20 and 30 (0.91 on time)
    assert row == (
        "| resnet18, 300 ms, Poisson | 18.3 / Triton 15 = 1.22x | 30 / Triton 10 = 3.00x "
        "| 30.2 / Triton 15 = 2.01x |"
    )


def test_the_readmes_check_of_the_capacity_rule_holds_on_the_grid() -> None:
    # the README: the monotone fit within 0.03x of the first crossing in every cell, on the same
    # side of the target; the highest rate on time meets it in 3 cells of 12
    readings = [
        capacity_rules(rounds) for _, rounds in rule_cases([CELLS.parent / "peers-full.json"])
    ]
    for read in readings:
        first, fit = read["first crossing"].ratio, read["monotone fit"].ratio
        assert abs(first - fit) <= 0.03
        assert (first >= TARGET_RATIO) == (fit >= TARGET_RATIO)
    assert sum(r["highest rate on time"].ratio >= TARGET_RATIO for r in readings) == 3


def test_a_file_that_is_no_grid_and_no_run_is_refused_by_rules(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"table": []}')
    with pytest.raises(SystemExit, match=r"--rules .*x\.json: expected a finished bench/peers\.py"):
        main(["--rules", str(path)])
    with pytest.raises(SystemExit, match=r"--rules .*missing\.json: cannot read it as JSON"):
        main(["--rules", str(tmp_path / "missing.json")])
    with pytest.raises(SystemExit, match="--rules: expected a file name"):
        main(["--rules", ","])

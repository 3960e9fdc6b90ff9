"""Loaders of measured latencies outside `layerbatch.profile/1` bound them as profiles do (one hour,
`scheduler.validate.MAX_LATENCY_MS`), refusing a larger one in one line that names the file, the
row and the bound: here PPipe's block-timing CSV tables (`layerbatch pipeline plan --profiles`)
and the same tables built in code (`ModelProfiles`), which share the one check."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import layerbatch
from scheduler.errors import InputError
from scheduler.pipeline.profiles import ModelProfiles, load_model_profiles
from scheduler.validate import MAX_LATENCY_MS
from sim import ppipe

HOUR_US = MAX_LATENCY_MS * 1000.0


def toy_folder(tmp_path: Path, cell: str) -> tuple[Path, Path]:
    """Model "toy", two blocks on GPU A at MPS 1, batch 1-2; block 1's batch-2 cell is `cell`."""
    folder = tmp_path / "timings"
    (folder / "transfer-sizes").mkdir(parents=True)
    table = folder / "toy-A-1.csv"
    table.write_text(f"1000,1800\n500,{cell}\n")
    (folder / "transfer-sizes" / "toy.csv").write_text("4096\n")
    return folder, table


@pytest.mark.parametrize("cell", ["1e300", "inf", f"{HOUR_US * 1.001:.0f}"])
def test_pipeline_plan_refuses_a_block_latency_above_an_hour_naming_file_and_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cell: str
) -> None:
    folder, table = toy_folder(tmp_path, cell)
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"gpus": {"A": {"count": 2, "per_server": 2}}, "nic_gbps": 10}))
    argv = ["pipeline", "plan", "--cluster", str(cluster), "--profiles", str(folder)]
    code = layerbatch.main([*argv, "--model", "toy", "--slo-ms", "100"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        f"layerbatch: {table}: row 2, column 2: expected a latency of at most 3600000000 us "
        f"(one hour), got {float(cell)!r}"
    ]


@pytest.mark.parametrize(
    ("timing", "transfer", "bad", "expected"),
    [
        ("1000,1800\n500\n", "4096\n", "timing", "row 2: expected 2 batch sizes like row 1, got 1"),
        ("1000,1800\n500,900\n", f"{10**400}\n", "transfer",
         "row 1: expected one byte count from 0 to 1099511627776 (a TiB), got "
         + repr([str(10**400)])[:57] + "..."),
        ("1000,1800\n500,900\n", "-4096\n", "transfer",
         "row 1: expected one byte count from 0 to 1099511627776 (a TiB), got ['-4096']"),
    ],
    ids=["ragged", "huge-cut", "negative-cut"],
)  # fmt: skip
def test_pipeline_plan_names_the_file_and_row_of_a_bad_table_or_cut_size(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    timing: str,
    transfer: str,
    bad: str,
    expected: str,
) -> None:
    """A cut of 10**400 bytes overflowed float in the planner (a traceback); ragged rows and a
    negative cut were named by model and GPU, not by file."""
    folder, table = toy_folder(tmp_path, "900")
    table.write_text(timing)
    cuts = folder / "transfer-sizes" / "toy.csv"
    cuts.write_text(transfer)
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"gpus": {"A": {"count": 2, "per_server": 2}}, "nic_gbps": 10}))
    argv = ["pipeline", "plan", "--cluster", str(cluster), "--profiles", str(folder)]
    code = layerbatch.main([*argv, "--model", "toy", "--slo-ms", "100"])
    out, err = capsys.readouterr()
    file = table if bad == "timing" else cuts
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"layerbatch: {file}: {expected}"]


def test_block_latencies_up_to_an_hour_load(tmp_path: Path) -> None:
    folder, _ = toy_folder(tmp_path, f"{HOUR_US:.0f}")
    profiles = load_model_profiles(folder, "toy")
    assert profiles.partition_latency_ms("A", 1, 1, 2, 2) == MAX_LATENCY_MS


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (math.inf, "a latency of at most 3600000000 us (one hour), got inf"),
        (1e300, "a latency of at most 3600000000 us (one hour), got 1e+300"),
        (
            HOUR_US * 1.001,
            f"a latency of at most 3600000000 us (one hour), got {HOUR_US * 1.001!r}",
        ),
        (math.nan, "positive microseconds, got nan"),
        (0.0, "positive microseconds, got 0.0"),
    ],
    ids=["inf", "1e300", "over-an-hour", "nan", "zero"],
)
def test_a_table_built_in_code_is_held_to_the_same_bounds_naming_row_and_column(
    value: float, expected: str
) -> None:
    """Tables built in code (e.g. `scheduler.pipeline.blocks.group_blocks`, tests) go through
    the same check as the CSV files, named by model, GPU and MPS level instead of a file."""
    tables = {
        ("A", 1): ((1000.0, 1800.0), (500.0, 900.0)),
        ("A", 2): ((1000.0, 1800.0), (500.0, value)),
    }
    with pytest.raises(InputError) as err:
        ModelProfiles(model="toy", num_blocks=2, latency_us=tables, cut_bytes=(4096,))
    assert str(err.value) == f"toy-A-2: row 2, column 2: expected {expected}"


def test_a_table_built_in_code_up_to_an_hour_is_kept() -> None:
    tables = {("A", 1): ((1000.0, HOUR_US), (500.0, 900.0))}
    profiles = ModelProfiles(model="toy", num_blocks=2, latency_us=tables, cut_bytes=(4096,))
    assert profiles.partition_latency_ms("A", 1, 0, 1, 2) == MAX_LATENCY_MS


SHIPPED_DIR = Path(__file__).resolve().parent.parent / "traces" / "data" / "profiles"


def ppipe_source(tmp_path: Path, timing: str, transfer: str) -> tuple[Path, Path, Path]:
    """PPipe's layout for model "toy" on GPU "A": (source folder, timing file, transfer file)."""
    src = tmp_path / "ppipe"
    (src / "block-timing-tf32").mkdir(parents=True)
    (src / "transfer-sizes").mkdir()
    table = src / "block-timing-tf32" / "toy-A-1.csv"
    table.write_text(timing)
    cuts = src / "transfer-sizes" / "toy.csv"
    cuts.write_text(transfer)
    return src, table, cuts


def test_the_ppipe_converter_still_writes_the_shipped_profiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundled PPipe files (traces/data/profiles/cloud/) convert to the shipped profiles byte
    for byte (wide_resnet101_2's PPipe files are not bundled)."""
    cloud = SHIPPED_DIR / "cloud"
    src = tmp_path / "ppipe"
    src.mkdir()
    (src / "block-timing-tf32").symlink_to(cloud / "ppipe")
    (src / "transfer-sizes").symlink_to(cloud / "ppipe-transfer-sizes")
    bundled = {m: s for m, s in ppipe.SHIPPED.items() if m != "wide_resnet101_2"}
    monkeypatch.setattr(ppipe, "SHIPPED", bundled)
    assert ppipe.main([str(src), str(tmp_path / "out")]) == 0
    written = sorted((tmp_path / "out").iterdir())
    assert len(written) == 2 * len(bundled)
    for path in written:
        assert path.read_text() == (SHIPPED_DIR / path.name).read_text(), path.name


@pytest.mark.parametrize(
    ("timing", "transfer", "bad", "expected"),
    [
        ("1000,1800\n500,1e300\n", "4096\n", "timing",
         "row 2, column 2: expected a latency of at most 3600000000 us (one hour), got 1e+300"),
        ("1000,1800\n500,inf\n", "4096\n", "timing",
         "row 2, column 2: expected a latency of at most 3600000000 us (one hour), got inf"),
        ("1000,1800\n500,-900\n", "4096\n", "timing",
         "row 2, column 2: expected positive microseconds, got -900.0"),
        ("1000,1800\n500,x\n", "4096\n", "timing",
         "row 2: expected comma-separated microseconds, got ['500', 'x']"),
        ("1000,1800\n500\n", "4096\n", "timing", "row 2: expected 2 batch sizes like row 1, got 1"),
        ("\n", "4096\n", "timing", "expected a row of block timings per block (it holds none)"),
        ("1000,1800\n500,900\n", "4096.5\n", "transfer",
         "row 1: expected one byte count from 0 to 1099511627776 (a TiB), got ['4096.5']"),
        ("1000,1800\n500,900\n", "1e300\n", "transfer",
         "row 1: expected one byte count from 0 to 1099511627776 (a TiB), got ['1e300']"),
        ("1000,1800\n500,900\n", "4096\n2048\n", "transfer",
         "expected a size per cut, 1 for the 2 blocks timed, got 2"),
    ],
    ids=["1e300-us", "inf-us", "negative-us", "word", "ragged", "empty", "fractional-bytes",
         "1e300-bytes", "one-cut-too-many"],
)  # fmt: skip
def test_the_ppipe_converter_refuses_a_bad_cell_in_one_line_and_writes_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    timing: str,
    transfer: str,
    bad: str,
    expected: str,
) -> None:
    """Before, these raised tracebacks (a word, ragged rows) or were converted as they were (a
    latency of 1e300 us, 4096.5 bytes cut to 4096, a transfer file of the wrong length)."""
    src, table, cuts = ppipe_source(tmp_path, timing, transfer)
    monkeypatch.setattr(ppipe, "SHIPPED", {"toy": [3, 8, 8]})
    monkeypatch.setattr(ppipe, "GPUS", ("A",))
    out = tmp_path / "out"
    assert ppipe.main([str(src), str(out)]) == 2
    file = table if bad == "timing" else cuts
    assert capsys.readouterr().err.strip().splitlines() == [f"sim.ppipe: {file}: {expected}"]
    assert not out.exists()


def test_the_ppipe_converter_names_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, _, _ = ppipe_source(tmp_path, "1000,1800\n500,900\n", "4096\n")
    monkeypatch.setattr(ppipe, "SHIPPED", {"toy": [3, 8, 8]})
    monkeypatch.setattr(ppipe, "GPUS", ("A", "B"))
    assert ppipe.main([str(src), str(tmp_path / "out")]) == 2
    missing = src / "block-timing-tf32" / "toy-B-1.csv"
    assert capsys.readouterr().err.strip().splitlines() == [
        f"sim.ppipe: {missing}: expected a readable CSV file, got 'No such file or directory'"
    ]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["toy-A.json"]

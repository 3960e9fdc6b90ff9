"""Block profiles for the pool-based pipeline planner (PPipe, paper 004, sections 5.1-5.2).

A model is pre-partitioned into N blocks (PPipe 5.2). For every GPU type k and MPS level m (the
GPU split into m equal virtual GPUs) one CSV file `{model}-{k}-{m}.csv` holds one row per block
and one column per batch size starting at 1, in microseconds (the PPipe repository's
`data/models/block-timing-tf32/` layout, bundled under `traces/data/profiles/cloud/ppipe/`).
Transfer sizes live in `transfer-sizes/{model}.csv`: N - 1 rows, row j the bytes per sample of
block j's output feature map, i.e. of the cut between blocks j and j + 1. The model's own input
and output are not listed: they cross no NIC.

A partition of blocks [i, j) on GPU k at MPS level m and batch b takes
`sum(latency_us[k, m][block][b - 1] for block in range(i, j)) / 1000` ms (PPipe 5.1: "the latency
of each partition is computed as the sum of the latencies of its constituent blocks").
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from scheduler.errors import InputError
from scheduler.validate import MAX_SAMPLE_BYTES, latency_at_most_an_hour

TIMING_SUBDIR = "block-timing-tf32"
TRANSFER_SUBDIR = "transfer-sizes"


@dataclass(frozen=True)
class ModelProfiles:
    """All block timings of one model and its cut sizes.

    Guarantees (checked by `__post_init__`, whether the tables were read from CSV files or built
    in code): every table has `num_blocks` rows of the same positive length (batch sizes
    1..max_batch), every latency is positive and at most an hour (`validate.MAX_LATENCY_MS`;
    `check_latencies`), and `cut_bytes` has `num_blocks - 1` entries from 0 to MAX_SAMPLE_BYTES.
    """

    model: str
    num_blocks: int
    # (gpu, mps) -> [block][batch - 1] latency in microseconds
    latency_us: Mapping[tuple[str, int], tuple[tuple[float, ...], ...]]
    cut_bytes: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise InputError(self.model, "blocks", "at least one block", self.num_blocks)
        if len(self.cut_bytes) != self.num_blocks - 1:
            raise InputError(
                self.model,
                "transfer sizes",
                f"{self.num_blocks - 1} cut sizes for {self.num_blocks} blocks",
                len(self.cut_bytes),
            )
        if any(not 0 <= size <= MAX_SAMPLE_BYTES for size in self.cut_bytes):
            raise InputError(
                self.model,
                "transfer sizes",
                f"byte counts from 0 to {MAX_SAMPLE_BYTES}",
                self.cut_bytes,
            )
        for (gpu, mps), table in self.latency_us.items():
            where = f"{self.model}-{gpu}-{mps}"
            if len(table) != self.num_blocks:
                raise InputError(where, "rows", f"{self.num_blocks} blocks", len(table))
            widths = {len(row) for row in table}
            if len(widths) != 1 or 0 in widths:
                raise InputError(
                    where,
                    "columns",
                    "the same positive number of batch sizes per block",
                    sorted(widths),
                )
            check_latencies(table, where)

    def gpus(self) -> tuple[str, ...]:
        """GPU types with at least one table, sorted."""
        return tuple(sorted({gpu for gpu, _ in self.latency_us}))

    def mps_levels(self, gpu: str) -> tuple[int, ...]:
        """MPS levels profiled on `gpu`, ascending (empty if none)."""
        return tuple(sorted(m for g, m in self.latency_us if g == gpu))

    def max_batch(self, gpu: str, mps: int) -> int:
        """Largest profiled batch size on (gpu, mps); KeyError if that table is missing."""
        return len(self.latency_us[(gpu, mps)][0])

    def partition_latency_ms(self, gpu: str, mps: int, start: int, stop: int, batch: int) -> float:
        """Latency of blocks [start, stop) at `batch` on one 1/mps virtual GPU of type `gpu`, ms."""
        table = self.latency_us[(gpu, mps)]
        return sum(table[block][batch - 1] for block in range(start, stop)) / 1000.0

    def require_gpu(self, gpu: str, source: str) -> None:
        """Raise InputError naming `source` (the cluster that has `gpu`), `gpu` and the
        profiled types if `gpu` has no table."""
        if gpu not in self.gpus():
            raise InputError(
                source,
                f"gpus.{gpu}",
                f"a GPU type {self.model} has block profiles for (one of {', '.join(self.gpus())})",
                gpu,
            )


def check_latencies(table: Sequence[Sequence[float]], source: str) -> None:
    """Refuse the first latency of `table` (a row per block, a column per batch size from 1,
    microseconds) that is not positive or is above an hour (`validate.MAX_LATENCY_MS`; inf and
    nan too), naming `source` (the CSV file, or `{model}-{gpu}-{mps}` for a table built in
    code), its row and its column, both counted from 1 as in the file."""
    for number, row in enumerate(table, start=1):
        for column, value in enumerate(row, start=1):
            where = f"row {number}, column {column}"
            if not value > 0:
                raise InputError(source, where, "positive microseconds", value)
            latency_at_most_an_hour(value, "us", source, where)


def _read_rows(path: Path) -> list[list[str]]:
    """The CSV file's rows that hold something (blank lines skipped: "row N" counts the rest);
    an unreadable file raises InputError naming it."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            return [row for row in csv.reader(handle) if row and any(c.strip() for c in row)]
    except OSError as exc:
        raise InputError(str(path), "", "a readable CSV file", exc.strerror) from None
    except UnicodeDecodeError as exc:
        raise InputError(str(path), "", f"a CSV file in UTF-8 ({exc.reason})") from None
    except csv.Error as exc:
        raise InputError(str(path), "", f"a CSV file ({exc})") from None


def read_block_timing_us(path: Path) -> tuple[tuple[float, ...], ...]:
    """A PPipe block-timing CSV file: a row per block, a column per batch size from 1, in
    microseconds. Raises InputError naming the file (and the row, and the column where there is
    one) for an empty file, a cell that is not a number, rows of different lengths, or a
    latency `check_latencies` refuses (checked here so that a bad cell is named with its file;
    `ModelProfiles.__post_init__` runs the same check again on every table)."""
    rows: list[tuple[float, ...]] = []
    for number, row in enumerate(_read_rows(path), start=1):
        try:
            rows.append(tuple(float(cell) for cell in row))
        except ValueError:
            raise InputError(
                str(path), f"row {number}", "comma-separated microseconds", row
            ) from None
        if len(rows[-1]) != len(rows[0]):
            raise InputError(
                str(path), f"row {number}", f"{len(rows[0])} batch sizes like row 1", len(row)
            )
    if not rows:
        raise InputError(str(path), "", "a row of block timings per block (it holds none)")
    check_latencies(rows, str(path))
    return tuple(rows)


def read_cut_bytes(path: Path) -> tuple[int, ...]:
    """A PPipe transfer-sizes CSV file: a row per cut between consecutive blocks, one integer,
    the bytes per sample crossing it. Raises InputError naming the file and the row for a row
    that is not one integer from 0 to MAX_SAMPLE_BYTES."""
    cuts = []
    for number, row in enumerate(_read_rows(path), start=1):
        try:
            size = int(row[0]) if len(row) == 1 else -1
        except ValueError:
            size = -1
        if not 0 <= size <= MAX_SAMPLE_BYTES:
            raise InputError(
                str(path),
                f"row {number}",
                f"one byte count from 0 to {MAX_SAMPLE_BYTES} (a TiB)",
                row,
            )
        cuts.append(size)
    return tuple(cuts)


def _timing_dir(profiles_dir: Path) -> Path:
    nested = profiles_dir / TIMING_SUBDIR
    return nested if nested.is_dir() else profiles_dir


def _transfer_file(profiles_dir: Path, model: str, transfer_dir: Path | None) -> Path:
    candidates = (
        [transfer_dir / f"{model}.csv"]
        if transfer_dir is not None
        else [
            profiles_dir / TRANSFER_SUBDIR / f"{model}.csv",
            profiles_dir.parent / TRANSFER_SUBDIR / f"{model}.csv",
        ]
    )
    for path in candidates:
        if path.is_file():
            return path
    raise InputError(
        str(candidates[0]), "", f"the transfer sizes of model {model} (one byte count per cut)"
    )


def available_models(profiles_dir: Path) -> tuple[str, ...]:
    """Models with at least one `{model}-{gpu}-{m}.csv` timing table in `profiles_dir`, sorted."""
    names = set()
    for path in _timing_dir(profiles_dir).glob("*.csv"):
        parts = path.stem.rsplit("-", 2)
        if len(parts) == 3 and parts[2].isdigit():
            names.add(parts[0])
    return tuple(sorted(names))


def load_model_profiles(
    profiles_dir: Path,
    model: str,
    *,
    gpus: Sequence[str] | None = None,
    max_mps: int | None = None,
    transfer_dir: Path | None = None,
) -> ModelProfiles:
    """Load `model`'s block timings (all GPU types, or just `gpus`) and its cut sizes.

    `profiles_dir` is either the flat timing folder or one with `block-timing-tf32/` and
    `transfer-sizes/` inside; transfer sizes are looked up in `transfer_dir` if given, else in
    `profiles_dir/transfer-sizes/` and then `profiles_dir/../transfer-sizes/`. MPS levels above
    `max_mps` are skipped. Raises InputError (one sentence) for a missing folder, an unknown
    model, a requested GPU type without tables, or a malformed file.
    """
    if not profiles_dir.is_dir():
        raise InputError(str(profiles_dir), "", "a folder of block profiles")
    timing_dir = _timing_dir(profiles_dir)
    tables: dict[tuple[str, int], tuple[tuple[float, ...], ...]] = {}
    for path in sorted(timing_dir.glob(f"{model}-*.csv")):
        parts = path.stem.rsplit("-", 2)
        if len(parts) != 3 or parts[0] != model or not parts[2].isdigit():
            continue
        gpu, mps = parts[1], int(parts[2])
        if mps < 1 or (max_mps is not None and mps > max_mps):
            continue
        if gpus is not None and gpu not in gpus:
            continue
        tables[(gpu, mps)] = read_block_timing_us(path)
    if not tables and not any(
        path.stem.rsplit("-", 2)[0] == model for path in timing_dir.glob(f"{model}-*.csv")
    ):
        known = available_models(profiles_dir)
        expected = (
            f"a model with block profiles (one of {', '.join(known)})"
            if known
            else "a folder of PPipe block timings, {model}-{gpu}-{mps}.csv (it holds none)"
        )
        raise InputError(str(timing_dir), "model", expected, model)
    profiled = {gpu for gpu, _ in tables}
    for gpu in gpus or ():
        if gpu not in profiled:
            raise InputError(
                str(timing_dir), "gpu", f"block profiles of model {model} on GPU type {gpu}", gpu
            )
    if not tables:
        raise InputError(str(timing_dir), "gpus", f"at least one GPU type for model {model}", gpus)
    num_blocks = len(next(iter(tables.values())))
    cuts = read_cut_bytes(_transfer_file(profiles_dir, model, transfer_dir))
    return ModelProfiles(model=model, num_blocks=num_blocks, latency_us=tables, cut_bytes=cuts)

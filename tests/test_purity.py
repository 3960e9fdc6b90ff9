"""What each package may import (DESIGN.md, Layout) and that the scheduler reads no clock.

Imports are read with `ast` from every .py file under the package (recursively), including
imports inside functions and `if TYPE_CHECKING:` blocks; a subprocess also imports every module
and checks which heavy packages ended up loaded.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sim_cases import REPO

STDLIB = frozenset(sys.stdlib_module_names)
FORBIDDEN_HEAVY = ("torch", "torchvision", "aiohttp", "cv2", "av", "msgpack")


def py_files(package: str) -> list[Path]:
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    return files


def imported_roots(path: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level module) of every absolute import in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module is not None:
                yield node.lineno, node.module.split(".")[0]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value.split(".")[0]


def offenders(package: str, allowed: set[str]) -> list[str]:
    bad = []
    for path in py_files(package):
        for line, root in imported_roots(path):
            if root == "__future__":
                continue
            if root not in allowed and root not in STDLIB:
                bad.append(f"{path.relative_to(REPO)}:{line} imports {root}")
    return bad


def test_scheduler_imports_only_stdlib_numpy_scipy_and_itself() -> None:
    assert offenders("scheduler", {"scheduler", "numpy", "scipy"}) == []


def test_traces_imports_only_stdlib_numpy_and_itself() -> None:
    assert offenders("traces", {"traces", "numpy"}) == []


def test_sim_never_imports_the_server_side_stack() -> None:
    bad = []
    for path in py_files("sim"):
        for line, root in imported_roots(path):
            if root in (*FORBIDDEN_HEAVY, "layerexec", "server", "client"):
                bad.append(f"{path.relative_to(REPO)}:{line} imports {root}")
    assert bad == []


def test_the_import_checker_sees_every_kind_of_import(tmp_path: Path) -> None:
    # the checker itself must not be blind: nested, aliased, from-, dynamic and TYPE_CHECKING
    src = tmp_path / "probe.py"
    src.write_text(
        "from __future__ import annotations\n"
        "import os.path as p\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import torch\n"
        "def f():\n"
        "    from aiohttp import web\n"
        "    import importlib\n"
        "    return importlib.import_module('cv2.dnn')\n"
        "from . import sibling\n"
    )
    roots = {root for _, root in imported_roots(src)}
    assert roots == {"__future__", "os", "typing", "torch", "aiohttp", "importlib", "cv2"}


# --- no clock, no hidden randomness in scheduler/ ----------------------------------------------
CLOCK_ATTRS = {
    ("time", "time"),
    ("time", "time_ns"),
    ("time", "monotonic"),
    ("time", "monotonic_ns"),
    ("time", "perf_counter"),
    ("time", "perf_counter_ns"),
    ("time", "process_time"),
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("datetime", "today"),
    ("date", "today"),
    ("loop", "time"),
}
CLOCK_NAMES = {"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns"}


def _dotted(node: ast.AST) -> list[str]:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return list(reversed(parts))


def clock_reads(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "time":
            names = {a.name for a in node.names} & CLOCK_NAMES
            if names:
                found.append(f"{node.lineno}: from time import {', '.join(sorted(names))}")
        if isinstance(node, ast.Call):
            chain = _dotted(node.func)
            if len(chain) >= 2 and (chain[-2], chain[-1]) in CLOCK_ATTRS:
                found.append(f"{node.lineno}: {'.'.join(chain)}()")
            # the module-level random generators are randomness nobody passed in
            if len(chain) >= 2 and chain[0] == "random" and chain[1] not in ("Random",):
                found.append(f"{node.lineno}: {'.'.join(chain)}()")
            if chain[:2] in (["np", "random"], ["numpy", "random"]) and chain[-1] not in (
                "default_rng",
                "Generator",
                "PCG64",
                "SeedSequence",
            ):
                found.append(f"{node.lineno}: {'.'.join(chain)}()")
            if chain[-2:] == ["random", "default_rng"] and not node.args and not node.keywords:
                found.append(f"{node.lineno}: unseeded default_rng()")
    return found


@pytest.mark.parametrize(
    "path", py_files("scheduler"), ids=lambda p: str(p.relative_to(REPO / "scheduler"))
)
def test_scheduler_reads_no_clock_and_no_global_randomness(path: Path) -> None:
    assert clock_reads(path) == []


def test_the_clock_checker_sees_clock_reads(tmp_path: Path) -> None:
    src = tmp_path / "probe.py"
    src.write_text(
        "import time, datetime as dt, random\n"
        "import numpy as np\n"
        "from time import perf_counter\n"
        "a = time.monotonic()\n"
        "b = dt.datetime.now()\n"
        "c = random.random()\n"
        "d = np.random.rand(3)\n"
        "e = np.random.default_rng()\n"
        "ok = np.random.default_rng(1)\n"
        "ok2 = random.Random(4)\n"
    )
    assert [x.split(":")[0] for x in clock_reads(src)] == ["3", "4", "5", "6", "7", "8"]


def test_importing_scheduler_traces_and_sim_loads_no_heavy_package() -> None:
    modules = []
    for package in ("scheduler", "traces", "sim"):
        for path in py_files(package):
            rel = path.relative_to(REPO).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules.append(".".join(parts))
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(json.dumps(sorted(set(m.split('.')[0] for m in sys.modules) & {set(FORBIDDEN_HEAVY)!r})))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []

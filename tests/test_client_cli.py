"""`layerbatch client`, `loadgen`, `traces` and `linkshell` on bad input: exit status 2 and one
line on stderr naming what is wrong (no traceback, no usage dump). In process through
`layerbatch.main` (fast), plus one subprocess run of `python -m layerbatch` for the real exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import layerbatch
from traces.network import bundled_traces

ROOT = Path(__file__).resolve().parent.parent
CIFAR = "resnet20_cifar10"
FAST = ["--app", CIFAR, "--source", "synthetic", "--frames", "2"]  # a tiny model, no video


@pytest.fixture(autouse=True)
def restore_torch_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the command in process; it must exit 2 with one line on stderr (returned)."""
    code = layerbatch.main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    assert captured.out == ""
    return lines[0]


def test_unknown_app(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["client", "--app", "nosuchmodel"], capsys)
    assert "nosuchmodel" in line and CIFAR in line  # names it and what is known


def test_missing_video(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["client", "--app", CIFAR, "--source", "/nonexistent.mp4"], capsys)
    assert "/nonexistent.mp4" in line and "synthetic" in line


def test_a_file_that_is_not_a_video(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "clip.mp4"
    bad.write_bytes(b"not a video at all\n" * 10)
    line = refused(["client", "--app", CIFAR, "--source", str(bad)], capsys)
    assert str(bad) in line


def test_malformed_uplink_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "broken.up"
    trace.write_text("10\n20\nfast\n40\n")
    line = refused(["client", *FAST, "--uplink", str(trace)], capsys)
    assert str(trace) in line and "line 3" in line and "'fast'" in line


def test_decreasing_downlink_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "backwards.down"
    trace.write_text("10\n30\n20\n")
    line = refused(["client", *FAST, "--downlink", str(trace)], capsys)
    assert str(trace) in line and "line 3" in line


def test_unknown_trace_name_lists_the_bundled_ones(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["client", *FAST, "--uplink", "nosuchtrace"], capsys)
    assert "nosuchtrace" in line
    assert "verizon-lte-short.up" in line


@pytest.mark.parametrize("value", ["0.5", "0", "-2", "fast", "inf"])
def test_client_slowdown_below_one(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["client", *FAST, f"--client-slowdown={value}"], capsys)
    assert "--client-slowdown" in line and repr(value) in line


def test_poisson_arrivals_need_a_rate(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["client", *FAST, "--arrival", "poisson"], capsys)
    assert "--arrival poisson" in line and "--rate" in line


def test_poisson_arrivals_take_no_fps(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["client", *FAST, "--arrival", "poisson", "--rate", "5", "--fps", "3"], capsys)
    assert "--fps" in line


def test_a_rate_needs_poisson_arrivals(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["client", *FAST, "--rate", "5"], capsys)
    assert "--rate" in line and "poisson" in line


def test_unknown_offload_mode(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["client", *FAST, "--offload", "cloud"], capsys)
    assert "--offload" in line and "cloud" in line


def test_loadgen_unknown_app(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["loadgen", "--app", "nosuchmodel"], capsys)
    assert "nosuchmodel" in line


def test_loadgen_bad_clients_list(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["loadgen", *FAST, "--clients", "2,0"], capsys)
    assert "--clients" in line and "'2,0'" in line


def test_loadgen_clients_list_needs_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["loadgen", *FAST, "--clients", "1,2"], capsys)
    assert "--clients" in line and "--sweep" in line


def test_loadgen_clients_list_without_sweep_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What does hold today: exit 2, and the last stderr line names --clients and --sweep."""
    code = layerbatch.main(["loadgen", *FAST, "--clients", "1,2"])
    captured = capsys.readouterr()
    assert code == 2
    assert "Traceback" not in captured.err
    last = captured.err.splitlines()[-1]
    assert "--clients" in last and "--sweep" in last


def test_traces_lists_the_bundled_traces(capsys: pytest.CaptureFixture[str]) -> None:
    assert layerbatch.main(["traces"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    lines = captured.out.splitlines()
    names = list(bundled_traces())
    assert len(lines) == len(names) >= 6
    for name, line in zip(names, lines, strict=True):
        assert line.split()[0] == name
        assert "Mbit/s" in line
    assert {"verizon-lte-short.up", "verizon-lte-short.down"} <= set(names)


def test_linkshell_bad_uplink(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["linkshell", "--uplink", "bad", "--downlink", "verizon-lte-short.down"], capsys)
    assert "bad" in line and "verizon-lte-short.up" in line


def test_linkshell_without_a_downlink(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["linkshell", "--uplink", "bad"], capsys)
    assert "--downlink" in line


def test_linkshell_bad_listen_address(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(
        [
            "linkshell",
            "--uplink",
            "verizon-lte-short.up",
            "--downlink",
            "verizon-lte-short.down",
            "--listen",
            "nowhere",
        ],
        capsys,
    )
    assert "--listen" in line and "nowhere" in line


def test_python_m_layerbatch_unknown_app_exits_2() -> None:
    """The real process: exit status 2, one line on stderr, nothing on stdout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "layerbatch", "client", "--app", "nosuchmodel"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "nosuchmodel" in proc.stderr
    assert "Traceback" not in proc.stderr

"""Mistakes a new user makes on the command line, each of which once ended in a traceback, a
hang, a run that silently served nothing, or an unclear line: now one line naming the flag or
file and what was expected, exit status 2, before any work (`layerbatch.main` in process)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.cli_cases import CIFAR, FAST_CLIENT, GOOGLENET, refused

SIM = ["sim", "--profile", GOOGLENET, "--requests", "20"]
CLUSTER = {
    "gpus": {"L4": {"count": 4, "per_server": 4}, "T4": {"count": 4, "per_server": 2}},
    "nic_gbps": 10,
}


@pytest.fixture(autouse=True)
def restore_torch_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("flag", ["--decode-ms", "--step-gap-ms", "--min-group-ms"])
def test_a_device_time_past_an_hour_is_refused(
    capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    """--decode-ms 1e300 overflowed in the layer-group split (OverflowError traceback)."""
    line = refused(capsys, *SIM, flag, "1e300")
    assert f"argument {flag}: expected a finite number >= 0, up to 3600000 ms (an hour)" in line


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        ([*SIM, "--rate", "1e-308"], "--rate"),
        ([*SIM, "--rate", "1e12"], "--rate"),
        (
            ["sim", "capacity", "--profile", GOOGLENET, "--rates", "1e-308", "--jobs", "1"],
            "--rates",
        ),
        (["demo", "--sim", "--rate", "1e-308", "--requests", "10"], "--rate"),
    ],
)
def test_a_simulated_rate_out_of_range_is_refused(
    capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    """A rate of 1e-308 put every arrival at inf ms: a run that served nothing, exit 0."""
    line = refused(capsys, *argv)
    assert flag in line and "from 1e-06 to 1e+09" in line


def test_an_empty_mix_is_refused_not_read_as_the_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = refused(capsys, *SIM, "--mix", "")
    assert line == "layerbatch: --mix: expected app=share with app one of googlenet-v3-pytorch"


def test_a_recorded_trace_with_more_cells_than_its_header_names_the_header(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Rows longer than the header (a JSON file given as --trace has them too) once ended in
    "AttributeError: 'NoneType' object has no attribute 'strip'"."""
    trace = tmp_path / "trace.csv"
    trace.write_text("when,where\n1.0,2.0,3.0\n2.0,3.0,4.0\n")
    line = refused(capsys, *SIM, "--arrival", "recorded", "--trace", str(trace))
    assert line.startswith(f"layerbatch: {trace}: header: expected a column named one of")


@pytest.mark.parametrize("apps", [{}, {"app": {"pose": [GOOGLENET]}}])
def test_an_apps_file_without_its_key_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, apps: dict[str, object]
) -> None:
    """It once read "apps: expected a JSON object, got 'NoneType'"."""
    path = tmp_path / "apps.json"
    path.write_text(json.dumps(apps))
    line = refused(capsys, *SIM, "--apps", str(path))
    assert "NoneType" not in line
    assert ("the key is missing" in line) if not apps else ("did you mean apps?" in line)


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["sim", "--profile", "googlenet-v3-pytorch-V10"], "googlenet-v3-pytorch-V100"),
        (["serve", "--apps", "resnet19"], "resnet18"),
        (["profile", "--model", "resnet19", "--verify"], "resnet18"),
        (["profile", "--model", CIFAR, "--stack-with", "vgg61", "--verify"], "vgg16"),
        (["client", "--app", "resnet19"], "resnet18"),
    ],
)
def test_a_misspelt_name_gets_the_nearest_one(
    capsys: pytest.CaptureFixture[str], argv: list[str], meant: str
) -> None:
    assert f"did you mean {meant}?" in refused(capsys, *argv)


def test_serve_refuses_an_empty_app_list_before_loading(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--apps ,` printed "loading  ..." before its refusal."""
    line = refused(capsys, "serve", "--apps", ",")
    assert line.startswith("layerbatch: --apps: expected a comma list of models") and "','" in line


@pytest.mark.parametrize(
    "argv",
    [
        ["client", *FAST_CLIENT],
        ["loadgen", "--app", CIFAR],
        ["serve", "--apps", CIFAR, "--host", "nosuchhost.invalid"],  # (no server, whatever)
    ],
)
def test_a_deadline_the_server_would_refuse_is_refused_first(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """The server answers 400 to a deadline past ten minutes; a client once sent every frame so
    (and its fleet slept deadline / 1000 seconds after the run)."""
    line = refused(capsys, *argv, "--deadline-ms", "1e300")
    assert "argument --deadline-ms: expected a deadline in ms above 0 and up to 600000" in line


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--rate", "5000"], "--rate: expected rates up to 1000 req/s for the server demo"),
        (["--deadline-ms", "1e300"], "--deadline-ms: expected a deadline up to 600000 ms"),
    ],
)
def test_the_server_demo_refuses_what_its_load_generator_cannot_send(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    needle: str,
) -> None:
    """`demo --rate 1e12` loaded five models, then ran out of memory drawing arrivals."""
    import client.demo

    def no_demo(**_: object) -> None:
        raise AssertionError("the demo ran")

    monkeypatch.setattr(client.demo, "run_demo", no_demo)
    assert needle in refused(capsys, "demo", "--duration", "1", *argv)


def test_a_link_scale_past_what_a_trace_can_hold_is_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--link-scale 1e300 overflowed the packet counts: "repeats may not contain negative
    values" from numpy, naming nothing."""
    argv = [*FAST_CLIENT, "--uplink", "tmobile-lte-short.up", "--link-scale", "1e300"]
    line = refused(capsys, "client", *argv, "--server", "http://127.0.0.1:1")
    assert line.startswith("layerbatch client: tmobile-lte-short.up: scale: expected a factor up")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--batch-sizes", "1,99999999999"], "argument --batch-sizes: expected a comma list of "),
        (["--max-batch", "99999"], "argument --max-batch: expected a positive integer up to 4096"),
        (["--warmup", "99999999"], "argument --warmup: expected a non-negative integer up to"),
    ],
)
def test_profile_refuses_sizes_past_what_a_profile_holds_before_measuring(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    argv: list[str],
    needle: str,
) -> None:
    """--batch-sizes 1,99999999999 tried to allocate a petabyte (RuntimeError traceback);
    --max-batch 99999 was refused only after measuring; --warmup 99999999 ran for hours."""
    import layerexec.profiler

    def no_measuring(*_: object, **__: object) -> None:
        raise AssertionError("it measured")

    monkeypatch.setattr(layerexec.profiler, "profile_model", no_measuring)
    line = refused(capsys, "profile", "--model", CIFAR, "--out", str(tmp_path / "p.json"), *argv)
    assert needle in line


def test_pipeline_plan_refuses_a_partition_limit_it_cannot_enumerate(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--max-parts 99 enumerated pipeline shapes for minutes, past 6 GB, on 4 L4 and 4 T4."""
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps(CLUSTER))
    line = refused(
        capsys, "pipeline", "plan", "--cluster", str(cluster), "--slo-ms", "49", "--max-parts", "99"
    )
    assert line.startswith("layerbatch: plan: max_parts: expected at most 4 partitions here")


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        (
            "--noise-sigma",
            "1e300",
            "argument --noise-sigma: expected a finite number >= 0, up to 1",
        ),
        ("--load-factor", "1e12", "argument --load-factor: expected a positive number up to 100"),
    ],
)
def test_pipeline_sim_names_an_absurd_noise_or_load(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, needle: str
) -> None:
    """--noise-sigma 1e300 overflowed (OverflowError traceback); --load-factor 1e12 was named
    as a --duration-s too long."""
    argv = ["pipeline", "sim", "--plan", "p.json", "--cluster", "c.json", "--slo-ms", "49"]
    assert needle in refused(capsys, *argv, flag, value)

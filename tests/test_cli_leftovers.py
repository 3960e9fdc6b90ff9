"""What a new user's sweep of the CLI left over: a client run in which no request arrives, a
`pipeline sim --load-factor` refused as another flag, a misspelt choice without the one meant,
and JSON written to a file named .png. Each is now one line naming the flag, exit status 2,
before any work (`layerbatch.main` in process)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import layerbatch
from tests.cli_cases import CIFAR, FAST_CLIENT, refused

CLUSTER = {
    "gpus": {"L4": {"count": 4, "per_server": 4}, "T4": {"count": 8, "per_server": 2}},
    "nic_gbps": 10,
}


@pytest.fixture
def no_run(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The client, load generator and profiler replaced by stubs that record that they ran."""
    import client.commands
    import layerexec.profiler

    ran: list[str] = []

    def stub(name: str) -> object:
        def run(*_: object, **__: object) -> int:
            ran.append(name)
            return 0

        return run

    monkeypatch.setattr(client.commands, "client_command", stub("client"))
    monkeypatch.setattr(client.commands, "loadgen_command", stub("loadgen"))
    monkeypatch.setattr(layerexec.profiler, "profile_model", stub("profile"))
    yield ran


# --- 1. a Poisson client in which no request arrives ------------------------------------------
def test_a_client_whose_poisson_rate_sends_nothing_is_refused_before_it_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--rate 0.001 for --duration 1 printed "requests: 0" and exit 0. Refused before the
    client loads its model, and with nothing written."""
    out = tmp_path / "run.json"
    argv = ["client", *FAST_CLIENT, "--server", "http://127.0.0.1:1", "--arrival", "poisson",
            "--json-out", str(out)]  # fmt: skip
    line = refused(capsys, *argv, "--rate", "0.001")
    assert line == (
        "layerbatch client: no request arrives within --duration 1 s at --rate 0.001 req/s "
        "(Poisson arrivals, --seed 0); raise --rate or --duration"
    )
    assert not out.exists()
    # requests arrive: the client runs them (locally, its server away) and writes its records
    assert layerbatch.main([*argv, "--rate", "5"]) == 0
    assert json.loads(out.read_text())["summary"]["requests"] > 0


# --- 2. pipeline sim: a load factor at which nothing arrives ---------------------------------
@pytest.fixture(scope="module")
def plan_args(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """`pipeline sim` flags for repvgg-b3's plan on 4 L4 and 8 T4 (646.1 req/s at 48.98 ms)."""
    folder = tmp_path_factory.mktemp("pipeline")
    cluster, plan = folder / "c.json", folder / "plan.json"
    cluster.write_text(json.dumps(CLUSTER))
    base = ["--cluster", str(cluster), "--slo-ms", "48.98"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert layerbatch.main(["pipeline", "plan", *base, "--margin", "0.4", "--json"]) == 0
    plan.write_text(out.getvalue())
    assert json.loads(out.getvalue())["throughput_rps"] > 100
    return ["pipeline", "sim", "--plan", str(plan), *base]


@pytest.mark.parametrize("duration_s", ["30", "1"])
def test_pipeline_sim_names_a_load_factor_below_any_simulated_rate(
    capsys: pytest.CaptureFixture[str], plan_args: list[str], duration_s: str
) -> None:
    """--load-factor 1e-300 was refused as "--rate: expected a request rate from 1e-06", a
    flag `pipeline sim` does not have."""
    line = refused(capsys, *plan_args, "--load-factor", "1e-300", "--duration-s", duration_s)
    assert line.startswith("layerbatch: --load-factor: expected a load factor from ")
    assert " to 100 of this plan's " in line and line.endswith(", got 1e-300")
    assert f"so that 10 requests or more are expected within --duration-s {duration_s}," in line
    assert "--rate" not in line


def test_pipeline_sim_names_a_load_factor_too_low_for_its_duration(
    capsys: pytest.CaptureFixture[str], plan_args: list[str]
) -> None:
    """--load-factor 1e-6 was refused as "--duration-s: expected a run in which requests
    arrive" alone; either flag mends it, and both are named with the value that does."""
    line = refused(capsys, *plan_args, "--load-factor", "1e-6", "--duration-s", "1")
    assert line.startswith("layerbatch: at --load-factor 1e-06 of this plan's ")
    assert "fewer than 10 requests (" in line and ") are expected within --duration-s 1;" in line
    found = re.search(
        r"raise --load-factor to (\S+) \(up to 100\) or --duration-s to (\S+) s$", line
    )
    assert found, line
    for flags in (
        ["--load-factor", found[1], "--duration-s", "1"],
        ["--load-factor", "1e-6", "--duration-s", found[2]],
    ):
        assert layerbatch.main([*plan_args, *flags, "--json"]) == 0, capsys.readouterr().err
        assert json.loads(capsys.readouterr().out)["requests"] > 0


# --- 3. a misspelt choice gets the nearest one ------------------------------------------------
def _choice_flags() -> Iterator[tuple[list[str], str]]:
    """(argv with a misspelling of a `choices=` value, the choice meant), for every such flag
    of every parser in layerbatch.py, and for the verbs themselves."""
    top = layerbatch.parser()
    parsers: list[tuple[list[str], argparse.ArgumentParser]] = [
        (["sim", "capacity"], layerbatch.capacity_parser()),
        (["pipeline", "plan"], layerbatch.pipeline_plan_parser()),
        (["pipeline", "sim"], layerbatch.pipeline_sim_parser()),
    ]
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            verbs = list(action.choices)
            yield ["schedul"], "schedule"
            parsers += [([verb], action.choices[verb]) for verb in verbs]
    for prefix, p in parsers:
        for action in p._actions:
            if action.choices is not None and action.option_strings:
                meant = str(next(iter(action.choices)))
                yield [*prefix, action.option_strings[0], meant + "x"], meant


CHOICE_FLAGS = list(_choice_flags())
assert {"schedule --policy", "plan --system", "pipeline sim --policy"} <= {
    " ".join(argv[:-1]) for argv, _ in CHOICE_FLAGS
}, "the sweep no longer finds the choices flags"


@pytest.mark.parametrize(
    ("argv", "meant"), CHOICE_FLAGS, ids=[" ".join(argv[:-1]) or "VERB" for argv, _ in CHOICE_FLAGS]
)
def test_a_misspelt_choice_gets_the_nearest_one(
    capsys: pytest.CaptureFixture[str], argv: list[str], meant: str
) -> None:
    """`--policy dp-tardyy` listed the policies but did not say which one was meant."""
    line = refused(capsys, *argv)
    assert f"invalid choice: '{argv[-1]}' (choose from " in line
    assert f"; did you mean {meant}? (see layerbatch" in line


# --- 4. JSON written to a file named for a picture --------------------------------------------
@pytest.mark.parametrize(
    ("argv", "flag", "name"),
    [
        (["profile", "--model", CIFAR], "--out", "p.png"),
        (["profile", "--model", CIFAR], "--out", "p"),
        (["client", *FAST_CLIENT, "--offload", "local"], "--json-out", "run.png"),
        (["loadgen", "--app", CIFAR], "--json-out", "run.txt"),
    ],
)
def test_a_json_output_not_named_json_is_refused_before_the_work(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    no_run: list[str],
    argv: list[str],
    flag: str,
    name: str,
) -> None:
    """`profile --out x.png` measured the model, then wrote its JSON into x.png."""
    out = tmp_path / name
    line = refused(capsys, *argv, flag, str(out))
    assert line == (
        f"layerbatch: argument {flag}: expected a file ending .json, as what is written there "
        f"is JSON, got {str(out)!r} (see layerbatch {argv[0]} --help)"
    )
    assert no_run == [] and not out.exists()

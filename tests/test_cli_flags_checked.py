"""Flags checked before any work: seeds, output files, folders, URLs, flags that only mean
something beside another one, and flags argparse would otherwise guess from a prefix. Each
refusal is exit status 2 with one line naming the flag (`layerbatch.main` in process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import layerbatch
from tests.cli_cases import CIFAR, FAST_CLIENT, GOOGLENET, refused
from tests.server_cases import free_port


@pytest.mark.parametrize(
    "argv",
    [
        ["sim", "--profile", GOOGLENET, "--requests", "10"],
        ["sim", "capacity", "--profile", GOOGLENET, "--requests", "10", "--rates", "10"],
        ["pipeline", "sim", "--plan", "p.json", "--cluster", "c.json", "--slo-ms", "100"],
        ["client", *FAST_CLIENT],
    ],
)
def test_a_negative_seed_is_refused_naming_it(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    line = refused(capsys, *argv, "--seed", "-1")
    assert "argument --seed: expected a non-negative integer, got '-1'" in line


def test_a_plot_matplotlib_cannot_write_is_refused_before_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "out.txt"
    line = refused(
        capsys, "sim", "capacity", "--profile", GOOGLENET, "--rates", "10", "--plot", str(out)
    )
    assert "argument --plot: expected a picture file ending .png, .svg, .pdf" in line
    assert not out.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["client", *FAST_CLIENT, "--offload", "local", "--json-out", "{dir}"],
        ["profile", "--model", CIFAR, "--out", "{dir}"],
        ["demo", "--plot", "{dir}/"],
    ],
)
def test_an_output_file_that_is_a_folder_is_refused_before_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    line = refused(capsys, *(a.replace("{dir}", str(tmp_path)) for a in argv))
    assert "expected a " in line and str(tmp_path) in line


def test_an_output_file_in_a_read_only_folder_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        if layerbatch.os.access(locked, layerbatch.os.W_OK):
            pytest.skip("this user writes anywhere (root)")
        line = refused(capsys, "profile", "--model", CIFAR, "--out", str(locked / "p.json"))
        assert "argument --out: expected a file in a folder this user can write" in line
    finally:
        locked.chmod(0o700)


def test_serve_profiles_must_be_a_folder(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state = tmp_path / "state.json"
    state.write_text("{}")
    line = refused(capsys, "serve", "--apps", CIFAR, "--profiles", str(state))
    assert f"argument --profiles: expected a folder, got the file '{state}'" in line


def test_serve_refuses_a_profile_file_that_holds_another_model_naming_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A `{model}-cpu.json` in --profiles that holds another model's profile is named, with what
    it holds and what --apps expected, before any model loads (it once read "deployment:
    apps.X: expected models with a profile (Y)", naming neither the file nor the folder)."""
    shipped = layerbatch.BUNDLED_PROFILES / f"{CIFAR}-cpu.json"
    doc = json.loads(shipped.read_text())
    doc["model"] = "mobilenet_v2"
    mislabelled = tmp_path / f"{CIFAR}-cpu.json"
    mislabelled.write_text(json.dumps(doc))
    argv = ["serve", "--apps", CIFAR, "--profiles", str(tmp_path), "--port", str(free_port())]
    line = refused(capsys, *argv)
    assert line == (
        f"layerbatch: {mislabelled}: model: expected the profile of {CIFAR} (the model --apps "
        "serves from this file), got 'mobilenet_v2'"
    )


@pytest.mark.parametrize(
    ("argv", "verb"),
    [
        (["serve", "--apps", CIFAR, "--profile", "x"], "serve"),  # not --profiles
        (["sim", "--profile", GOOGLENET, "--rates", "5"], "sim"),  # --rates is capacity's
        (["sim", "capcity", "--profile", GOOGLENET], "sim"),
    ],
)
def test_a_prefix_or_unknown_flag_is_refused_pointing_at_the_verbs_help(
    capsys: pytest.CaptureFixture[str], argv: list[str], verb: str
) -> None:
    line = refused(capsys, *argv)
    assert "unrecognized arguments" in line and f"(see layerbatch {verb} --help)" in line


def test_sim_capacity_takes_no_prefix_of_rates(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "sim", "capacity", "--profile", GOOGLENET, "--rate", "5")
    assert "unrecognized arguments: --rate 5" in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sim", "--profile", GOOGLENET, "--trace", "t.csv"], "--trace gives the arrivals of"),
        (
            ["sim", "--profile", GOOGLENET, "--policy", "dp-time", "--admission-share", "0.5"],
            "--admission-share is the door of policies that drop late requests (dp-tardy)",
        ),
        (
            ["sim", "capacity", "--profile", GOOGLENET, "--policies", "edf", "--exact"],
            "--exact is the per-request form of dp-time and dp-tardy; not with edf",
        ),
        (
            ["sim", "--profile", GOOGLENET, "--mix", "googlenet-v3-pytorch=1,googlenet-v3-pytorch=2"],
            "expected each app once",
        ),
        (["demo", "--requests", "10"], "--requests counts simulated requests"),
        (["demo", "--sim", "--duration", "3"], "--duration is the server demo's"),
        (["loadgen", "--plot", "x.png"], "--plot draws a --sweep"),
        (["serve", "--apps", f"{CIFAR},{CIFAR}"], "expected a comma list of models, each once"),
        (["serve", "--apps", CIFAR, "--admin-token", ""], "expected a non-empty token"),
        (
            ["pipeline", "sim", "--plan", "p", "--cluster", "c", "--slo-ms", "9", "--trace", "t"],
            "--trace gives the arrivals of --arrival trace only",
        ),
        (
            ["pipeline", "sim", "--plan", "p", "--cluster", "c", "--slo-ms", "9", "--sweep",
             "--load-factor", "0.5"],
            "--sweep runs load factors 0.05..1.0: not with --load-factor",
        ),
        (["client", *FAST_CLIENT, "--server", "notaurl"], "argument --server: expected an http"),
        (
            ["client", *FAST_CLIENT, "--server", "http://127.0.0.1:99999"],
            "argument --server: expected an http",
        ),
        (["client", *FAST_CLIENT, "--uplink-offset-s", "-1"], "argument --uplink-offset-s"),
        (["sim", "--profile", GOOGLENET, "--profile", "resnet18-cpu"],
         "expected profiles measured on one device (the models share one device here), got "
         "'V100-tensorrt-tf32 and cpu-2t'"),
        (["client", *FAST_CLIENT, "--offload", "local", "--uplink", "verizon-lte-short.up"],
         "with --offload local nothing is"),
        (["profile", "--model", CIFAR, "--out", "p.json", "--warmup", "-1"], "argument --warmup"),
        (["sim", "--profile", GOOGLENET, "--requests", "100000000000"],
         "argument --requests: expected a positive integer up to 10000000"),
        (["demo", "--sim", "--requests", "100000000000"], "up to 10000000"),
        (["sim", "--profile", GOOGLENET, "--requests", "\uff11\uff10\uff10"],
         "argument --requests: expected a positive integer, got"),
        (["sim", "--profile", GOOGLENET, "--requests", "1_000"], "argument --requests"),
        (["sim", "--profile", GOOGLENET, "--rate", "1_000"], "argument --rate"),
        (["client", *FAST_CLIENT, "--fps", "1e9"], "argument --fps: expected a positive number up to 1000"),
        (["loadgen", "--clients", "1,2,1", "--sweep"], "argument --clients"),
        (["serve", "--threads", "100000"], "argument --threads: expected a positive integer up to 1024"),
        (["sim", "capacity", "--profile", GOOGLENET, "--rates", "10:1e9:1"], "at most 1000 rates"),
        (["sim", "capacity", "--profile", GOOGLENET, "--rates", "10,20,10"], "a comma list of different"),
        (["sim", "capacity", "--profile", GOOGLENET, "--policies", "edf,edf"], "each once"),
        (["serve", "--apps", "nosuch"], "--apps: expected a comma list of models layerexec knows"),
        (["pipeline", "plan", "--cluster", "c", "--slo-ms", "9", "--model", "cyclegan", "--model",
          "cyclegan"], "--model: expected each model once, got 'cyclegan'"),
        (["linkshell", "--uplink", "verizon-lte-short.up", "--downlink", "verizon-lte-short.down",
          "--upstream", "http://127.0.0.1:8080"], "expected HOST:PORT, not a URL"),
    ],
)  # fmt: skip
def test_flags_that_mean_nothing_here_are_refused(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert message in refused(capsys, *argv)


def test_a_load_test_needs_its_server_to_answer_first(capsys: pytest.CaptureFixture[str]) -> None:
    """(A mobile client runs its frames locally instead: test_client_e2e.)"""
    url = f"http://127.0.0.1:{free_port()}"
    line = refused(capsys, "loadgen", *FAST_CLIENT, "--server", url)
    assert line.startswith(f"layerbatch loadgen: --server: could not reach {url}")
    assert line.endswith("expected a running `layerbatch serve`")


def test_demo_sim_runs_at_the_rates_and_deadline_given(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plot = tmp_path / "d.png"
    code = layerbatch.main(
        ["demo", "--sim", "--requests", "40", "--rate", "100,50", "--deadline-ms", "40",
         "--plot", str(plot)]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and plot.exists()
    assert "Poisson arrivals, deadline 40 ms." in out
    rows = out[out.index("policy      capacity") :].splitlines()[1:-1]  # up to "plot: ..."
    assert len(rows) == len(layerbatch.POLICY_CHOICES)
    assert {row.split()[1] for row in rows} <= {"50", "100", "none"}  # only the rates given


def test_pipeline_help_names_its_two_verbs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        layerbatch.main(["pipeline", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "`layerbatch pipeline plan`" in out and "`layerbatch pipeline sim`" in out


def test_an_empty_pipeline_plan_exits_1_saying_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert layerbatch._found(12.5, "optimal", None) == 0
    assert layerbatch._found(0.0, "time_limit", 5.0) == 1
    err = capsys.readouterr().err
    assert (
        err
        == "layerbatch: no plan serves every model within --time-limit-s 5 (solver: time_limit)\n"
    )


def test_the_demos_default_plot_is_checked_before_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").write_text("a file where the demo would make its folder")
    for argv in (["demo"], ["demo", "--sim"]):
        line = refused(capsys, *argv)
        assert line.startswith("layerbatch: --plot (default out/demo-")
        assert "expected a file in a folder this user can write" in line


def test_a_plot_through_a_link_into_no_folder_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    link = tmp_path / "dangling.png"
    link.symlink_to(tmp_path / "nowhere" / "x.png")
    line = refused(capsys, "demo", "--sim", "--plot", str(link))
    assert "a link into a folder that does not exist" in line


def test_files_with_a_byte_order_mark_read_and_files_not_in_utf8_are_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "bom.csv"
    trace.write_bytes(b"\xef\xbb\xbfTIMESTAMP\n0.5\n1.0\n1.25\n")
    argv = ["sim", "--profile", GOOGLENET, "--arrival", "recorded", "--requests", "20", "--json"]
    assert layerbatch.main([*argv, "--trace", str(trace)]) == 0
    assert capsys.readouterr().out.startswith("{")
    latin = tmp_path / "latin.csv"
    latin.write_bytes("TIMESTAMP\n0.5 \xe9\n".encode("latin-1"))
    line = refused(capsys, *argv, "--trace", str(latin))
    assert line.startswith(f"layerbatch: {latin}: expected a trace file in UTF-8")
    apps = tmp_path / "apps.json"
    apps.write_bytes(b"\xef\xbb\xbf" + b'{"apps": {"g": ["googlenet-v3-pytorch"]}}')
    assert layerbatch.main([*argv[:3], "--apps", str(apps), "--requests", "20", "--json"]) == 0


def test_profile_needs_an_out_file_unless_it_only_verifies(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = refused(capsys, "profile", "--model", CIFAR)
    assert line == "layerbatch: profile needs --out FILE (or --verify alone, to check the stages)"
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    try:
        assert layerbatch.main(["profile", "--model", CIFAR, "--verify", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert out.startswith(f"{CIFAR}: ") and "largest |split - whole| = " in out
    assert list(tmp_path.iterdir()) == []  # verified only: nothing written


# `layerbatch plan`: a switch of a feature the system does not have, or its split does not run,
# would change nothing. Checked before the workload is read (here it does not even exist).
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--system", "nexus", "--no-dummy"],
         "--no-dummy applies to --system harpagon, piccolo, optimal only; not with --system nexus"),
        (["--system", "optimal", "--no-reassign"],
         "--no-reassign applies to --system harpagon, piccolo only; not with --system optimal"),
        (["--system", "piccolo", "--no-merge"],
         "--no-merge applies to --system harpagon (its lc split) only; not with --system piccolo"),
        (["--system", "scrooge", "--no-cost-direct"],
         "--no-cost-direct applies to --system harpagon (its lc split) only; not with --system "
         "scrooge"),
        (["--system", "piccolo", "--no-exchange"],
         "--no-exchange applies to --system harpagon only; not with --system piccolo"),
        (["--system", "optimal", "--split", "even"],
         "--split applies to --system harpagon, piccolo, nexus, scrooge, inferline, clipper only; "
         "not with --system optimal"),
        (["--split", "throughput", "--no-merge"],
         "--no-merge applies to --system harpagon (its lc split) only; not with --split "
         "throughput"),
        (["--system", "clipper", "--split", "lc", "--no-cost-direct"],
         "--no-cost-direct applies to --system harpagon (its lc split) only; not with --system "
         "clipper"),
    ],
)  # fmt: skip
def test_plan_refuses_a_switch_the_system_does_not_have(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], message: str
) -> None:
    workload = tmp_path / "no-such-workload.json"
    line = refused(capsys, "plan", "--workload", str(workload), *argv)
    assert line == f"layerbatch: {message}"

"""`layerbatch pipeline plan` on the bundled PPipe profiles: PPipe at least NP, one-line refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import layerbatch

CLUSTER = {"gpus": {"L4": {"count": 4, "per_server": 4}, "T4": {"count": 8, "per_server": 2}},
           "nic_gbps": 10}  # fmt: skip


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = layerbatch.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_ppipe_beats_no_partitioning_on_repvgg(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps(CLUSTER))
    base = ["pipeline", "plan", "--cluster", str(cluster), "--slo-ms", "48.98", "--margin", "0.4"]
    code, out, _ = run([*base, "--json"], capsys)
    assert code == 0
    ppipe = json.loads(out)
    code, out, _ = run([*base, "--json", "--system", "np"], capsys)
    np_plan = json.loads(out)
    assert ppipe["status"] == np_plan["status"] == "optimal"
    assert ppipe["throughput_rps"] > np_plan["throughput_rps"] * 1.2
    for p in ppipe["pipelines"]:
        assert p["latency_ms"] <= 48.98 * (1 - 0.4) + 1e-6
    used = {"L4": 0.0, "T4": 0.0}
    for p in ppipe["pipelines"]:
        for q in p["partitions"]:
            used[q["gpu"]] += q["gpus_used"]
    assert used["L4"] <= 4 + 1e-9 and used["T4"] <= 8 + 1e-9


def test_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps(CLUSTER))
    base = ["pipeline", "plan", "--cluster", str(cluster)]
    code, _, err = run([*base, "--slo-ms", "2"], capsys)
    assert code == 2 and "at least" in err and len(err.strip().splitlines()) == 1
    code, _, err = run([*base, "--slo-ms", "40", "--model", "nosuch"], capsys)
    assert code == 2 and "nosuch" in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"gpus": {"H100": {"count": 2, "per_server": 2}}, "nic_gbps": 10}))
    code, _, err = run(["pipeline", "plan", "--cluster", str(bad), "--slo-ms", "40"], capsys)
    assert code == 2 and "H100" in err and len(err.strip().splitlines()) == 1


SHIPPED = Path(layerbatch.__file__).resolve().parent / "traces" / "data" / "profiles"


def test_dart_r_pairs_l4_with_t4_below_ppipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps(CLUSTER))
    base = ["pipeline", "plan", "--cluster", str(cluster), "--slo-ms", "48.98", "--margin", "0.4"]
    docs = {}
    for system in ("ppipe", "np", "dart-r"):
        code, out, _ = run([*base, "--json", "--system", system], capsys)
        assert code == 0
        docs[system] = json.loads(out)
    dart = docs["dart-r"]
    assert dart["status"] == "optimal" and dart["gap"] == 0.0
    assert dart["throughput_rps"] <= docs["ppipe"]["throughput_rps"]
    # repvgg-b3: 4 (L4, T4) pairs; the 4 leftover T4 cannot run it alone within 0.6 x SLO.
    (chain,) = dart["pipelines"]
    assert [q["gpu"] for q in chain["partitions"]] == ["L4", "T4"]
    assert [q["workers"] for q in chain["partitions"]] == [4, 4]
    code, out, _ = run([*base, "--system", "dart-r"], capsys)
    assert code == 0 and out.startswith("repvgg-b3 (dart-r): ")


def test_profile_files_grouped_into_blocks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = tmp_path / "c.json"
    cluster.write_text(
        json.dumps(
            {
                "gpus": {
                    "V100": {"count": 2, "per_server": 2},
                    "T4": {"count": 4, "per_server": 2},
                },
                "nic_gbps": 10,
            }
        )
    )
    args = ["pipeline", "plan", "--cluster", str(cluster), "--slo-ms", "60", "--margin", "0.4"]
    files = ["--profile", str(SHIPPED / "repvgg-b3-V100.json")]
    files += ["--profile", str(SHIPPED / "repvgg-b3-T4.json")]
    code, out, err = run([*args, *files, "--blocks", "5", "--max-parts", "2", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["status"] == "optimal" and doc["throughput_rps"] > 0
    assert all(p["partitions"][-1]["blocks"][1] == 5 for p in doc["pipelines"])
    # shipped profiles by name, as `schedule` and `sim` take them: the same plan
    names = ["--profile", "V100=repvgg-b3-V100", "--profile", "T4=repvgg-b3-T4"]
    code, out, err = run([*args, *names, "--blocks", "5", "--max-parts", "2", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["throughput_rps"] == doc["throughput_rps"]
    # a GPU type of the cluster without a profile: the cluster file and its field named
    with_l4 = tmp_path / "l4.json"
    with_l4.write_text(json.dumps(CLUSTER))
    code, _, err = run(["pipeline", "plan", "--cluster", str(with_l4), "--slo-ms", "60", *names,
                        "--blocks", "5"], capsys)  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"layerbatch: {with_l4}: gpus.L4: expected a GPU type repvgg-b3 has")
    code, _, err = run([*args, *files, "--model", "repvgg-b3"], capsys)
    assert code == 2 and "not both" in err
    code, _, err = run([*args, "--blocks", "5"], capsys)
    assert code == 2 and "--blocks" in err


def test_two_models_with_shares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps(CLUSTER))
    args = ["pipeline", "plan", "--cluster", str(cluster), "--margin", "0.4", "--mps", "2"]
    args += ["--model", "repvgg-b3", "--model", "googlenet-v3-pytorch"]
    slo = ["--slo-ms", "repvgg-b3=48.98,googlenet-v3-pytorch=26.04"]
    share = ["--share", "repvgg-b3=1,googlenet-v3-pytorch=3"]
    code, out, err = run([*args, *slo, *share, "--json"], capsys)
    assert code == 0, err
    # before a solve that may take minutes, one line on stderr says what it is solving
    progress = r"^layerbatch: \d+ candidate pipelines \(repvgg-b3 \d+, googlenet-v3-pytorch \d+\); solving \.\.\.$"
    assert re.search(progress, err, re.M), err
    doc = json.loads(out)
    t = doc["normalized_rps"]
    assert doc["status"] == "optimal" and t > 0
    assert doc["models"]["repvgg-b3"]["throughput_rps"] >= 1 * t * (1 - 1e-6)
    assert doc["models"]["googlenet-v3-pytorch"]["throughput_rps"] >= 3 * t * (1 - 1e-6)
    assert doc["models"]["googlenet-v3-pytorch"]["slo_ms"] == 26.04
    code, out, _ = run([*args, "--slo-ms", "40"], capsys)  # one SLO, equal shares
    assert code == 0 and out.startswith("2 models (ppipe): smallest throughput / share")
    code, _, err = run([*args, *slo, "--share", "repvgg-b3=1"], capsys)
    assert code == 2 and "one value per model" in err and len(err.strip().splitlines()) == 1
    code, _, err = run([*args, "--slo-ms", "-5"], capsys)  # one number, not a positive one
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert (
        "--slo-ms: expected a positive number of ms (or NAME=MS,... one per model), got '-5'" in err
    )


def test_a_plan_simulated_at_another_slo_is_noted_and_for_another_model_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps(CLUSTER))
    base = ["--cluster", str(cluster), "--slo-ms", "48.98"]
    code, out, _ = run(["pipeline", "plan", *base, "--margin", "0.4", "--json"], capsys)
    assert code == 0 and json.loads(out)["model"] == "repvgg-b3"
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    sim = ["pipeline", "sim", "--plan", str(plan), "--duration-s", "0.5", "--json"]
    code, out, err = run([*sim, *base], capsys)
    assert code == 0 and err == "" and json.loads(out)["attainment"] > 0
    code, out, err = run([*sim, "--cluster", str(cluster), "--slo-ms", "60"], capsys)
    assert code == 0 and json.loads(out)["requests"] > 0
    assert (
        err
        == f"layerbatch: note: {plan} was planned for an SLO of 48.98 ms; simulating it at --slo-ms 60\n"
    )
    code, _, err = run([*sim, *base, "--model", "cyclegan"], capsys)
    assert code == 2 and "expected a plan for cyclegan" in err and "made for repvgg-b3" in err

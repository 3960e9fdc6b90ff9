"""`layerbatch pipeline plan` on the bundled PPipe profiles: PPipe at least NP, one-line refusals."""

from __future__ import annotations

import json
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

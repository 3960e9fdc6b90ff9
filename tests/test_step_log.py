"""The step log (`layerbatch serve --step-log`, server/step_log.py) and its replay
(bench/step_replay.py): the server writes every step it ran, a real replay runs them again."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import layerbatch
from bench.step_replay import Step, parse_beside, read_steps, replay
from scheduler.errors import InputError
from scheduler.profile import scaled_stages
from server.build import build_runtime
from server.step_log import StepLog
from tests.server_cases import CIFAR, LONG_DEADLINE_MS, infer, infer_doc, serve, small_jpeg


def line(**over: Any) -> str:
    d = {"t_ms": 1.0, "lane": "step", "model": CIFAR, "first_stage": 0, "stages": 3,
         "batch": 2, "ms": 1.5, "planned_ms": 1.4, "cancelled": False}  # fmt: skip
    return json.dumps({**d, **over})


def drop_line(**over: Any) -> str:
    d = {"t_ms": 2.0, "drop": "r7", "app": CIFAR, "reason": "late", "waited_ms": 3.0,
         "left_ms": 4.0, "late_by_ms": 0.5}  # fmt: skip
    return json.dumps({**d, **over})


def test_every_step_drop_and_answer_is_written_as_it_happened(tmp_path: Path) -> None:
    log = StepLog(tmp_path / "s.jsonl")
    log.write("step", 5.0, CIFAR, 2, 0, 4, 0.1, 0.0, True)  # cancelled before its first stage
    log.write("stacked", 6.25, CIFAR, 2, 3, 4, 2.5, 2.25, False)
    log.drop(7.5, "r9", CIFAR, "too late", 12.0, 30.0, 4.5, replica=1)
    log.drop(8.0, "r10", CIFAR, "expired", 40.0, 0.0, None)
    log.answer(9.125, "r11", CIFAR, 305.25, -5.25, replica=0)
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert lines == [
        {"t_ms": 5.0, "lane": "step", "model": CIFAR, "first_stage": 2, "stages": 0,
         "batch": 4, "ms": 0.1, "planned_ms": 0.0, "cancelled": True},
        {"t_ms": 6.25, "lane": "stacked", "model": CIFAR, "first_stage": 2, "stages": 3,
         "batch": 4, "ms": 2.5, "planned_ms": 2.25, "cancelled": False},
        {"t_ms": 7.5, "drop": "r9", "app": CIFAR, "reason": "too late", "waited_ms": 12.0,
         "left_ms": 30.0, "late_by_ms": 4.5, "replica": 1},
        {"t_ms": 8.0, "drop": "r10", "app": CIFAR, "reason": "expired", "waited_ms": 40.0,
         "left_ms": 0.0, "late_by_ms": None},
        {"t_ms": 9.125, "answer": "r11", "app": CIFAR, "total_ms": 305.25, "left_ms": -5.25,
         "replica": 0},
    ]  # fmt: skip


def test_a_path_it_cannot_write_is_named_before_any_model_loads(tmp_path: Path) -> None:
    where = tmp_path / "no-such-folder" / "s.jsonl"
    with pytest.raises(
        InputError, match=r"--step-log .*no-such-folder/s\.jsonl: expected a file it can write"
    ):
        build_runtime([CIFAR], step_log=where)


def test_the_cli_says_so_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = layerbatch.main(
        ["serve", "--apps", CIFAR, "--step-log", str(tmp_path / "nope" / "s.jsonl")]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "s.jsonl: expected a file it can write (No such file or directory)" in err
    assert "Traceback" not in err


@pytest.mark.asyncio
async def test_the_server_logs_every_step_it_ran(aiohttp_client: Any, tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    runtime = build_runtime([CIFAR], threads=1, decode_threads=1, step_log=path)
    runtime.calibrate = False
    client = await serve(aiohttp_client, runtime)
    answers = await asyncio.gather(
        *(infer(client, infer_doc(small_jpeg(i), request_id=f"r{i}")) for i in range(3))
    )
    for i, (status, answer) in enumerate(answers):
        assert status == 200
        assert (answer["status"], answer["request_id"]) == ("ok", f"r{i}")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    steps = [d for d in lines if "lane" in d]
    assert steps and {s["lane"] for s in steps} == {"step"}
    # one line for each request served, with the server's own timing in its answer
    served = {d["answer"]: d for d in lines if "answer" in d}
    assert len(served) + len(steps) == len(lines)
    for _, answer in answers:
        d = served[answer["request_id"]]
        assert d["app"] == CIFAR
        assert d["total_ms"] == pytest.approx(answer["timing"]["total_ms"], abs=1e-2)
        assert d["left_ms"] == pytest.approx(LONG_DEADLINE_MS - d["total_ms"], abs=1e-2)
        assert (d["left_ms"] >= 0) == answer["on_time"]
    assert {s["model"] for s in steps} == {CIFAR}
    # every request went through every stage: the stage-samples add up
    n_stages = runtime.deployment.profiles[CIFAR].num_stages
    done = sum(s["stages"] * s["batch"] for s in steps)  # cancelled ones count what they ran
    assert done == 3 * n_stages
    assert all(s["ms"] > 0 and s["t_ms"] >= 0 for s in steps)
    # what each step's plan took its stages to cost, by the profile at its batch
    profile = runtime.deployment.profiles[CIFAR]
    for s in steps:
        k0, n, b = s["first_stage"], s["stages"], s["batch"]
        expected = sum(profile.latency_ms(k, b) for k in range(k0, k0 + n))
        assert s["planned_ms"] == pytest.approx(expected, abs=1e-3)
    times = [s["t_ms"] for s in steps]
    assert times == sorted(times)
    # the same time /metrics counts as the executor's steps
    assert sum(s["ms"] for s in steps) == pytest.approx(runtime.metrics.busy_ms["step"], abs=0.01)


@pytest.mark.asyncio
async def test_the_server_logs_a_request_it_drops_with_how_late_it_would_have_been(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    """A request due sooner than its model can run alone is dropped as hopeless: its line says
    how long it waited, how long it had left and how late it would have finished alone. (The
    plans' profile is made 1000 times slower, so that the deadline is not already past when
    the request, decoded, is first planned, and admission is off: it would turn the request
    away undecoded, before any plan.)"""
    path = tmp_path / "steps.jsonl"
    runtime = build_runtime([CIFAR], threads=1, decode_threads=1, step_log=path)
    runtime.calibrate = False
    runtime.admission = None
    d = runtime.deployment
    slow = [scaled_stages(p, [1000.0] * p.num_stages) for p in d.profiles.values()]
    runtime.deployment = d.with_profiles(slow)
    runtime.engine.rebase(runtime.deployment)
    client = await serve(aiohttp_client, runtime)
    alone_ms = runtime.deployment.solo_ms(CIFAR, 0)
    status, answer = await infer(
        client, infer_doc(small_jpeg(0), request_id="tight", deadline_ms=alone_ms / 4)
    )
    assert status == 200 and answer["status"] == "dropped"
    drops = [d for d in map(json.loads, path.read_text().splitlines()) if "drop" in d]
    assert len(drops) == 1
    d = drops[0]
    assert (d["drop"], d["app"], d["reason"]) == ("tight", CIFAR, answer["reason"])
    assert d["waited_ms"] >= 0 and d["waited_ms"] + d["left_ms"] == pytest.approx(alone_ms / 4)
    # predicted to finish alone_ms after it was dropped, alone_ms / 4 after it arrived
    assert d["late_by_ms"] == pytest.approx(alone_ms - d["left_ms"], abs=1e-2)
    assert d["late_by_ms"] > 0


def test_replay_reads_only_uncancelled_steps_of_the_executor_thread(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    lines = [line(), line(lane="stacked"), line(cancelled=True), line(stages=0), line(batch=0)]
    answer = json.dumps(
        {"t_ms": 3.0, "answer": "r8", "app": CIFAR, "total_ms": 9.0, "left_ms": 1.0}
    )
    path.write_text("\n".join([*lines, drop_line(), answer, line(first_stage=3)]))
    assert read_steps(path) == [
        Step(CIFAR, 0, 3, 2, 1.5, 1.0, 1.4),
        Step(CIFAR, 3, 3, 2, 1.5, 1.0, 1.4),
    ]


def test_replay_names_the_line_that_is_not_a_step(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(line() + "\n" + json.dumps({"t_ms": 1}) + "\n")
    with pytest.raises(SystemExit, match=r"s\.jsonl:2: expected a step log line"):
        read_steps(path)


@pytest.mark.parametrize("bad", ["10", "10:1.5", "25:0.1", "x:0.1"])
def test_beside_must_be_nice_and_share(bad: str) -> None:
    with pytest.raises(SystemExit, match="--beside: expected"):
        parse_beside(bad)


def test_replay_runs_the_logged_steps_alone_and_beside_a_burner() -> None:
    steps = [Step(CIFAR, 0, 4, 2, 10.0), Step(CIFAR, 4, 3, 1, 5.0), Step(CIFAR, 0, 7, 3, 20.0)]
    totals = replay(steps, [(0, 0.2)], chunk=2, rounds=2)
    assert set(totals) == {CIFAR, "all"}
    t = totals["all"]
    assert t["logged"] == pytest.approx(2 * 35.0)  # summed over both rounds
    assert t["alone"] > 0 and t["beside"] > 0
    assert totals[CIFAR] == t


def test_step_ratio_reads_how_each_batch_size_ran_against_its_plan(tmp_path: Path) -> None:
    """bench/step_ratio.py: per model and batch size, summed time over summed planned time (time-
    weighted), median and p90 of the steps' own ratios; warm-up and unplanned steps left out."""
    from bench.step_ratio import ratios_by_batch

    path = tmp_path / "s.jsonl"
    rows = [line(batch=1, ms=1.2, planned_ms=1.0), line(batch=1, ms=3.0, planned_ms=2.0),
            line(batch=4, ms=9.0, planned_ms=10.0), line(batch=4, ms=0.5, planned_ms=0.0),
            line(batch=4, ms=50.0, planned_ms=1.0, t_ms=-1.0)]  # fmt: skip
    path.write_text("\n".join(rows))
    table = ratios_by_batch(s for s in read_steps(path) if s.t_ms >= 0.0)
    assert set(table) == {(CIFAR, 1), (CIFAR, 4)}
    assert table[(CIFAR, 1)]["steps"] == 2
    assert table[(CIFAR, 1)]["ratio"] == pytest.approx(4.2 / 3.0)  # not the mean of 1.2 and 1.5
    assert table[(CIFAR, 1)]["p50"] == pytest.approx(1.35)
    assert table[(CIFAR, 4)] == pytest.approx({"steps": 1, "ratio": 0.9, "p50": 0.9, "p90": 0.9})

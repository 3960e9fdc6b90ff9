"""bench/peers.py's full benchmark keeps what it measured as it goes and `--resume` continues an
interrupted run from there (issue 9). The servers and their measurements are scripted here (each
knob's capacity given, `Scripted`); starting and measuring real servers is tested in
tests/test_peers_bench.py. What is tested is the bookkeeping: which searches run, which servers
start, what is written, and that a resumed run ends where an uninterrupted one does."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from bench.peers import parse_args, resume
from bench.peers_capacity import RateSearch
from bench.peers_knobs import Knobs
from bench.peers_load import Run, Sample
from bench.peers_settings import Settings
from bench.peers_tuning import Bench, checkpoint_path

CAPACITY_RPS = {"B=4,5ms": 10.0, "B=8,5ms": 20.0}  # what each scripted knob serves


class Interrupted(Exception):
    """The scripted run stops here, as Ctrl-C would stop a real one."""


class Scripted(Bench):
    """A Bench whose servers are not started and whose capacity searches find CAPACITY_RPS
    (on time at it, late 20% above it); every start and search is logged, and the search
    numbered `stop_at` raises Interrupted."""

    def __init__(
        self, st: Settings, checkpoint: Path, stop_at: int = 0, ceiling_rps: float = 30.0
    ) -> None:
        super().__init__(st, [], np.zeros(1), checkpoint)
        self.log: list[tuple[Any, ...]] = []
        self.stop_at = stop_at
        self.ceiling_rps = ceiling_rps

    def compute_bound(self, model: str) -> dict[str, Any]:
        self.log.append(("bound", model))
        bound = {"decode_ms": 2.0, "forward_ms": 23.0, "layout": "channels_last", "rps": 40.0}
        return {**bound, "batched_rps": self.ceiling_rps}

    async def start(
        self, server: str, model: str, knobs: Knobs, deadline: float, tries: int = 2
    ) -> Any:
        self.log.append(("start", knobs.label))
        return SimpleNamespace(knobs=knobs, set_deadline=lambda d: None)

    async def stop(self, load: Any) -> None:
        self.log.append(("stop", load.knobs.label))

    async def search(
        self,
        load: Any,
        cache: dict[float, Run],
        arrival: str,
        deadline: float,
        start: float,
        tol: float,
        tuning: bool,
        known: Sequence[tuple[float, bool]] = (),
    ) -> RateSearch:
        searches = sum(1 for e in self.log if e[0] == "search") + 1
        if searches == self.stop_at:
            raise Interrupted
        self.log.append(("search", load.knobs.label, deadline, arrival, tuning, len(cache)))
        capacity = CAPACITY_RPS[load.knobs.label]
        rs = RateSearch(start, tol)
        for rate, ok in known:
            rs.record(rate, ok)
        for rate in (capacity, round(1.2 * capacity, 1)):
            ok = rate <= capacity
            cache[rate] = Run([Sample(0.0, "ok", 1.0 if ok else 2.0 * deadline)] * 10, 1.0)
            rs.record(rate, ok)
        return rs


def settings(tmp_path: Path, *more: str) -> Settings:
    """TorchServe tuned over two knobs at two deadlines under two arrival processes: four
    cases, one server start serving all four."""
    argv = ["--quick", "--servers", "torchserve", "--deadlines", "300,1000"]
    argv += ["--arrivals", "poisson,azure", "--workers", "1", "--batches", "4,8", "--delays", "5"]
    argv += ["--settle-pairs", "0", "--out", str(tmp_path / "peers.json"), *more]
    return dataclasses.replace(parse_args(argv), logdir=tmp_path)


def measured(bench: Bench) -> dict[str, Any]:
    """What a run measured, as its saved document holds it."""
    doc = json.loads(json.dumps(bench.document(), default=str))
    return {k: doc[k] for k in ("tuning", "settled", "results")}


def test_an_uninterrupted_run_searches_each_case_afresh_and_saves_after_each_search(
    tmp_path: Path,
) -> None:
    st = settings(tmp_path)
    bench = Scripted(st, checkpoint_path(st.out))
    asyncio.run(bench.server_model("torchserve", "resnet18", 40.0))
    starts = [e[1] for e in bench.log if e[0] == "start"]
    searches = [e for e in bench.log if e[0] == "search"]
    assert starts == ["B=4,5ms", "B=8,5ms", "B=8,5ms"]  # each knob tuned, then the best's capacity
    assert len(searches) == 12 and all(e[5] == 0 for e in searches)  # no runs of another case
    assert [e[4] for e in searches] == [True] * 8 + [False] * 4
    assert {(r["deadline_ms"], r["arrival"]) for r in bench.results} == {
        (d, a) for d in (300.0, 1000.0) for a in ("poisson", "azure")
    }
    assert {(r["knobs"], r["capacity_rps"], r["tuned_under"]) for r in bench.results} == {
        ("B=8,5ms", 20.0, "poisson"),
        ("B=8,5ms", 20.0, "azure"),
    }
    for r in bench.results:  # the final search starts from the tuning's runs of its own case
        assert r["tuning_runs_at_these_knobs"] == {
            "20": {**r["tuning_runs_at_these_knobs"]["20"], "on_time_ratio": 1.0},
            "24": {**r["tuning_runs_at_these_knobs"]["24"], "on_time_ratio": 0.0},
        }
    saved = json.loads(checkpoint_path(st.out).read_text())
    assert measured(bench) == {k: saved[k] for k in ("tuning", "settled", "results")}
    assert saved["settings"] == st.record()


def test_a_resumed_run_measures_only_what_the_interrupted_one_lacked_and_ends_the_same(
    tmp_path: Path,
) -> None:
    st = settings(tmp_path)
    whole = Scripted(dataclasses.replace(st, out=tmp_path / "whole.json"), tmp_path / "w.json")
    asyncio.run(whole.server_model("torchserve", "resnet18", 40.0))

    first = Scripted(st, checkpoint_path(st.out), stop_at=6)  # in B=8's tuning, its 2nd case
    with pytest.raises(Interrupted):
        asyncio.run(first.server_model("torchserve", "resnet18", 40.0))
    assert first.log[-1] == ("stop", "B=8,5ms")  # the server was stopped on the way out
    saved = json.loads(checkpoint_path(st.out).read_text())
    assert len(saved["tuning"]) == 5 and saved["results"] == []

    again = Scripted(dataclasses.replace(st, resume=True), checkpoint_path(st.out))
    resume(again, again.st)
    asyncio.run(again.server_model("torchserve", "resnet18", 40.0))
    assert [e[1] for e in again.log if e[0] == "start"] == ["B=8,5ms", "B=8,5ms"]
    assert [e[4] for e in again.log if e[0] == "search"] == [True] * 3 + [False] * 4
    assert measured(again) == measured(whole)


def test_a_settling_on_record_is_taken_as_it_was_decided(tmp_path: Path) -> None:
    st = settings(tmp_path)
    bench = Scripted(st, checkpoint_path(st.out))
    case = {"server": "torchserve", "model": "resnet18", "deadline_ms": 300.0, "arrival": "azure"}
    bench.settled.append({**case, "knobs": "B=4,5ms", "tuning_pick": "B=8,5ms"})
    asyncio.run(bench.server_model("torchserve", "resnet18", 40.0))
    knobs = {(r["deadline_ms"], r["arrival"]): r["knobs"] for r in bench.results}
    assert knobs.pop((300.0, "azure")) == "B=4,5ms"
    assert set(knobs.values()) == {"B=8,5ms"}


def test_resume_refuses_other_settings_and_a_new_run_refuses_an_unfinished_one(
    tmp_path: Path,
) -> None:
    st = settings(tmp_path)
    first = Scripted(st, checkpoint_path(st.out), stop_at=3)
    with pytest.raises(Interrupted):
        asyncio.run(first.server_model("torchserve", "resnet18", 40.0))

    with pytest.raises(SystemExit, match="holds an unfinished run: --resume continues it"):
        resume(Scripted(st, checkpoint_path(st.out)), st)
    other = settings(tmp_path, "--seed", "7", "--resume")
    with pytest.raises(SystemExit, match=r"measured with seed = 1, this run has 7"):
        resume(Scripted(other, checkpoint_path(st.out)), other)
    assert settings(tmp_path, "--resume").record() == st.record()  # --resume itself is no setting

    checkpoint_path(st.out).write_text("[1, 2]")
    again = dataclasses.replace(st, resume=True)
    with pytest.raises(SystemExit, match=r"expected a bench/peers\.py run"):
        resume(Scripted(again, checkpoint_path(st.out)), again)


def test_resume_with_nothing_saved_starts_from_the_beginning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    st = settings(tmp_path, "--resume")
    bench = Scripted(st, checkpoint_path(st.out))
    resume(bench, st)
    assert "no unfinished run at" in capsys.readouterr().out
    assert bench.tuning == [] and bench.results == []
    with pytest.raises(SystemExit, match="--resume: continues a full benchmark run"):
        parse_args(["--resume", "--interleave", "10"])


def test_a_model_resumed_halfway_measures_its_bound_again_and_warns_of_another_speed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bound measured when the model's runs began is kept; the resumed run measures it
    again, keeps that too, and says when the machine's speed differs by more than 15%."""
    st = dataclasses.replace(settings(tmp_path), servers=["torchserve"])
    first = Scripted(st, checkpoint_path(st.out), stop_at=3, ceiling_rps=50.0)
    with pytest.raises(Interrupted):
        asyncio.run(first.model("resnet18"))
    assert first.log[0] == ("bound", "resnet18")

    again = Scripted(
        dataclasses.replace(st, resume=True), checkpoint_path(st.out), ceiling_rps=30.0
    )
    resume(again, again.st)
    capsys.readouterr()
    asyncio.run(again.model("resnet18"))
    out = capsys.readouterr().out
    assert "[resnet18] resumed: warning: this machine's speed changed" in out
    assert "50.0 req/s before, 30.0 after" in out
    bound = again.bounds["resnet18"]
    assert bound["before"]["batched_rps"] == 50.0 and bound["after"]["batched_rps"] == 30.0
    assert [b["batched_rps"] for b in bound["resumed"]] == [30.0]
    assert [e for e in again.log if e[0] == "bound"] == [("bound", "resnet18")] * 2

    done = Scripted(dataclasses.replace(st, resume=True), checkpoint_path(st.out))
    done.resume(again.document(), "whole")
    asyncio.run(done.model("resnet18"))  # every server on record: nothing measured
    assert done.log == []

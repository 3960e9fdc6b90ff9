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

CAPACITY_RPS = {
    "B=4,5ms": 10.0,
    "B=8,5ms": 20.0,
    "B=8,20ms": 20.0,
    "default": 24.0,
    "2 replicas": 30.0,
}  # what each scripted knob serves


class Interrupted(Exception):
    """The scripted run stops here, as Ctrl-C would stop a real one."""


class Scripted(Bench):
    """A Bench whose servers are not started and whose knobs serve CAPACITY_RPS: a run is on
    time at that rate and below, and late (every request timed out) above; every
    start and search is logged, and the search numbered `stop_at` raises Interrupted."""

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
        run = SimpleNamespace(server=server, knobs=knobs)
        return SimpleNamespace(knobs=knobs, run=run, set_deadline=lambda d: None)

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
        floor: float | None = None,
        then: float | None = None,
    ) -> RateSearch:
        searches = sum(1 for e in self.log if e[0] == "search") + 1
        if searches == self.stop_at:
            raise Interrupted
        label = load.knobs.label
        self.log.append(("search", label, deadline, arrival, tuning, len(cache), start, floor))
        return await super().search(
            load, cache, arrival, deadline, start, tol, tuning, known, floor, then
        )

    async def measure(
        self, load: Any, cache: dict[float, Run], arrival: str, rate: float, tuning: bool
    ) -> Run:
        ok = rate <= CAPACITY_RPS[load.knobs.label]
        cache[rate] = Run([Sample(0.0, "ok", 1.0) if ok else Sample(0.0, "timeout", 1e6)] * 10, 1.0)
        return cache[rate]


def settings(tmp_path: Path, *more: str) -> Settings:
    """TorchServe tuned over two knobs at two deadlines under two arrival processes: four
    cases, one server start serving all four; each capacity searched after its tuning
    (--final-rounds 0: the final rounds are tested in tests/test_peers_final.py)."""
    argv = ["--quick", "--servers", "torchserve", "--deadlines", "300,1000"]
    argv += ["--arrivals", "poisson,azure", "--workers", "1", "--batches", "4,8", "--delays", "5"]
    argv += ["--settle-pairs", "0", "--final-rounds", "0", "--out", str(tmp_path / "peers.json")]
    argv += more
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
    assert {(r["knobs"], r["tuned_under"]) for r in bench.results} == {
        ("B=8,5ms", "poisson"),
        ("B=8,5ms", "azure"),
    }
    for r in bench.results:  # within the final tolerance (0.1 with --quick) of 20 req/s
        assert 20.0 / 1.1 <= r["capacity_rps"] <= 20.0
        case = (r["deadline_ms"], r["arrival"])
        tuned = next(
            t["runs"]
            for t in bench.tuning
            if (t["deadline_ms"], t["arrival"], t["knobs"]["max_batch"]) == (*case, 8)
        )
        # the final search starts from the tuning's runs of its own case, between its bounds
        assert r["tuning_runs_at_these_knobs"] == tuned
        lo = max(float(x) for x, s in tuned.items() if s["on_time_ratio"] == 1.0)
        hi = min(float(x) for x, s in tuned.items() if s["on_time_ratio"] == 0.0)
        assert all(lo < float(x) < hi for x in r["runs"])
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


def tuned_rps(bench: Bench, batch: int, delay_ms: float = 5.0) -> dict[tuple[float, str], Any]:
    """The capacity each tuning search at B=`batch`,`delay_ms` found, by case."""
    return {
        (t["deadline_ms"], t["arrival"]): t["capacity_rps"]
        for t in bench.tuning
        if (t["knobs"]["max_batch"], t["knobs"]["delay_ms"]) == (batch, delay_ms)
    }


def test_a_knob_that_misses_the_best_capacity_so_far_is_screened_out_at_it(
    tmp_path: Path,
) -> None:
    """B=8 (20 req/s) tuned first sets the bar: B=4's searches start at B=8's capacity and end
    when it is late there, recorded with no capacity, below it; the pick is B=8. --no-screen
    searches B=4 from where the searches start, and picks the same."""
    st = settings(tmp_path, "--batches", "8,4")
    bench = Scripted(st, checkpoint_path(st.out))
    asyncio.run(bench.server_model("torchserve", "resnet18", 40.0))
    bars = tuned_rps(bench, 8)
    tuning = [((e[2], e[3]), e[1], e[6], e[7]) for e in bench.log if e[0] == "search" and e[4]]
    assert [(label, floor) for _, label, _, floor in tuning[:4]] == [("B=8,5ms", None)] * 4
    assert tuning[4:] == [(c, "B=4,5ms", bars[c], bars[c]) for c in bars]
    for r in (t for t in bench.tuning if t["knobs"]["max_batch"] == 4):
        bar = bars[(r["deadline_ms"], r["arrival"])]
        assert (r["capacity_rps"], r["below_rps"], r["on_time_at_first_failure"]) == (
            None,
            bar,
            0.0,
        )
        assert list(r["runs"]) == [f"{bar:g}"]
    assert {r["knobs"] for r in bench.results} == {"B=8,5ms"}
    found = [  # a screened knob's None is no capacity to start from
        r["capacity_rps"]
        for r in [*bench.results, *bench.tuning]
        if (r["deadline_ms"], r["arrival"]) == (300.0, "poisson") and r["capacity_rps"]
    ]
    assert len(found) == 2
    assert bench._start_rate("resnet18", 300.0, "poisson", 40.0) == pytest.approx(0.8 * max(found))

    out = str(tmp_path / "full.json")
    full = settings(tmp_path, "--batches", "8,4", "--no-screen", "--out", out)
    assert full.record()["screen"] is False and st.record()["screen"] is True
    whole = Scripted(full, checkpoint_path(full.out))
    asyncio.run(whole.server_model("torchserve", "resnet18", 40.0))
    bars = tuned_rps(whole, 8)
    assert [(e[6], e[7]) for e in whole.log if e[0] == "search" and e[1] == "B=4,5ms"] == [
        (pytest.approx(0.8 * bars[c]), None) for c in bars
    ]
    assert all(10.0 / 1.15 <= c <= 10.0 for c in tuned_rps(whole, 4).values())
    assert {r["knobs"] for r in whole.results} == {"B=8,5ms"}


def test_a_knob_level_with_the_best_so_far_is_measured_where_the_best_failed_and_stops(
    tmp_path: Path,
) -> None:
    """B=8,20ms serves what B=8,5ms does: on time at the bar, late where B=8,5ms first was,
    and searched no further; its capacity is the bar, and the tie goes to the first listed."""
    st = settings(tmp_path, "--batches", "8", "--delays", "5,20")
    bench = Scripted(st, checkpoint_path(st.out))
    asyncio.run(bench.server_model("torchserve", "resnet18", 40.0))
    first = {
        (t["deadline_ms"], t["arrival"]): t for t in bench.tuning if t["knobs"]["delay_ms"] == 5
    }
    for t in (t for t in bench.tuning if t["knobs"]["delay_ms"] == 20):
        best = first[(t["deadline_ms"], t["arrival"])]
        failed = min(float(x) for x, s in best["runs"].items() if s["on_time_ratio"] == 0.0)
        assert t["capacity_rps"] == best["capacity_rps"] and "below_rps" not in t
        assert list(t["runs"]) == [f"{best['capacity_rps']:g}", f"{failed:g}"]
    assert {r["knobs"] for r in bench.results} == {"B=8,5ms"}


def test_the_knobs_best_in_a_tuning_run_on_record_are_tried_first(tmp_path: Path) -> None:
    """A tuning file beside --out names B=8 TorchServe's best at 300 ms under Poisson arrivals:
    B=8 is tuned first, and B=4 then costs one run a case, screened out below it."""
    record = {"server": "torchserve", "model": "resnet18", "deadline_ms": 300.0}
    doc = {
        "results": [{**record, "arrival": "poisson", "tuned_under": "poisson", "knobs": "B=8,5ms"}]
    }
    (tmp_path / "peers-quick-resnet18-earlier.json").write_text(json.dumps(doc))
    st = settings(tmp_path)
    assert [k.label for k in st.grid] == ["B=4,5ms", "B=8,5ms"]
    bench = Scripted(st, checkpoint_path(st.out))
    asyncio.run(bench.server_model("torchserve", "resnet18", 40.0))
    assert [e[1] for e in bench.log if e[0] == "start"] == ["B=8,5ms", "B=4,5ms", "B=8,5ms"]
    assert [len(t["runs"]) for t in bench.tuning if t["knobs"]["max_batch"] == 4] == [1] * 4
    assert {r["knobs"] for r in bench.results} == {"B=8,5ms"}


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

"""bench/peers.py's full benchmark measures its capacities in interleaved rounds once every
server is tuned on a model (`--final-rounds`, bench/peers_final.py, issue 9). The servers are
scripted (`Rounds`: a knob's tuning runs are on time up to its capacity, and in the rounds its
on-time ratio falls as (capacity x speed / rate)^3 above it); one test runs the rounds on a real
layerbatch server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.peers import parse_args, resume
from bench.peers_crossing import THRESHOLD
from bench.peers_final import (
    EXTEND_BY,
    FINAL_SPAN,
    FINAL_STEP,
    MAX_EXTENSIONS,
    MAX_REFINES,
    final_interval,
    final_rates,
    measure_rounds,
    new_record,
    next_rate,
)
from bench.peers_knobs import Knobs
from bench.peers_load import Sample, summarize
from bench.peers_table import format_table, table_rows
from bench.peers_tuning import Bench, checkpoint_path
from tests.test_peers_resume import CAPACITY_RPS, Interrupted, Scripted, settings

CROSSING = (1 / THRESHOLD) ** (1 / 3)  # where (capacity / rate)^3 is the threshold, over capacity


def on_time_at(rate: float, capacity: float) -> float:
    return min(1.0, (capacity / rate) ** 3)


class Rounds(Scripted):
    """`Scripted` whose rounds are scripted too: each server's knob serves its CAPACITY_RPS x
    `speed[server]` in them (`on_time_at`); every run measured alone is logged as ("alone",
    server, rate), and the one numbered `stop_alone_at` raises Interrupted."""

    def __init__(
        self,
        st: Any,
        checkpoint: Path,
        speed: Mapping[str, float] | None = None,
        stop_alone_at: int = 0,
    ) -> None:
        super().__init__(st, checkpoint)
        self.speed = dict(speed or {})
        self.stop_alone_at = stop_alone_at

    async def start(
        self, server: str, model: str, knobs: Knobs, deadline: float, tries: int = 2
    ) -> Any:
        load = await super().start(server, model, knobs, deadline, tries)
        load.server = server
        return load

    async def warm(self, loads: Any, rate: float, deadline_ms: float) -> None:
        self.log.append(("warm", rate))

    async def revive(self, load: Any, rate: float) -> bool:
        return False

    def arrivals(
        self, arrival: str, rate: float, tuning: bool, seed: int
    ) -> tuple[np.ndarray, float]:
        return np.full(100, rate), 1.0  # the rate, for `alone` to read

    async def alone(
        self,
        load: Any,
        others: Mapping[str, Any],
        arrivals_s: np.ndarray,
        duration_s: float,
        deadline_ms: float,
    ) -> dict[str, Any]:
        if sum(e[0] == "alone" for e in self.log) + 1 == self.stop_alone_at:
            raise Interrupted
        rate = float(arrivals_s[0])
        self.log.append(("alone", load.server, rate))
        capacity = CAPACITY_RPS[load.knobs.label] * self.speed.get(load.server, 1.0)
        on_time = round(100 * on_time_at(rate, capacity))
        samples = [Sample(0.0, "ok", 50.0)] * on_time + [Sample(0.0, "timeout", 1e6)] * (
            100 - on_time
        )
        s = summarize(samples, deadline_ms, duration_s)
        return {**s, "others_cpu_s": {n: 0.0 for n in others}, "client_cpu_share": 0.01}


def two_servers(tmp_path: Path) -> Any:
    """TorchServe over B=4 (10 req/s) and B=8 (20), layerbatch over 1 replica (24) and 2 (30),
    at 300 ms under Poisson arrivals, two final rounds."""
    st = settings(tmp_path, "--deadlines", "300", "--arrivals", "poisson", "--final-rounds", "2")
    return dataclasses.replace(st, servers=["torchserve", "layerbatch"])


def test_the_rates_span_the_tuned_capacities_and_an_edge_is_measured_further_out() -> None:
    rates = final_rates([20.0, 0.0, 30.0])
    assert rates == sorted(rates) and 4 <= len(rates) <= 6
    assert rates[0] == pytest.approx(FINAL_SPAN[0] * 20.0, abs=0.05)
    assert rates[-1] == pytest.approx(FINAL_SPAN[1] * 30.0, abs=0.05)
    assert len(final_rates([10.0])) == 4  # a narrow span still gets four rates
    assert len(final_rates([5.0, 60.0])) == 6  # a wide one at most six
    with pytest.raises(ValueError, match="at least one above 0"):
        final_rates([0.0])

    above, below, crossed = {10.0: 1.0, 12.0: 0.95}, {10.0: 0.5, 12.0: 0.2}, {10.0: 0.95, 12.0: 0.8}
    assert next_rate(above) == (pytest.approx(12.0 * EXTEND_BY, abs=0.05), "beyond")
    assert next_rate(above, ["beyond"]) == (pytest.approx(12.0 * EXTEND_BY**2, abs=0.05), "beyond")
    assert next_rate(below) == (pytest.approx(10.0 / EXTEND_BY, abs=0.05), "beyond")
    assert next_rate(below, ["beyond"] * MAX_EXTENSIONS) is None
    assert next_rate(crossed) == (pytest.approx((10.0 * 12.0) ** 0.5, abs=0.05), "between")
    assert next_rate(crossed, ["between"] * MAX_REFINES) is None
    assert next_rate({10.0: 0.95, 10.0 * FINAL_STEP: 0.8}) is None  # close enough


def test_every_server_is_tuned_then_measured_in_alternating_rounds_at_its_pick(
    tmp_path: Path,
) -> None:
    """No capacity is searched after tuning: each server's pick serves every rate in each of
    the two rounds, in turn (the order reversed in the second), after one warm-up, then rates
    between the two 15% apart around its crossing (six rates span 17-34.5 req/s); each
    capacity is the crossing of its mean on-time ratio, and the table reads layerbatch / best
    peer from those, with its interval over the rounds."""
    st = two_servers(tmp_path)
    bench = Rounds(st, checkpoint_path(st.out))
    asyncio.run(bench.model("resnet18"))
    assert all(e[4] for e in bench.log if e[0] == "search")  # tuning searches only
    (record,) = bench.finals
    assert record["knobs"] == {"torchserve": "B=8,5ms", "layerbatch": "2 replicas"}
    assert record["tuned_under"] == {"torchserve": "poisson", "layerbatch": "poisson"}
    assert record["complete"] and record["rates"] == final_rates(record["tuned_rps"].values())
    rates = record["rates"]
    alone = [(e[1], e[2]) for e in bench.log if e[0] == "alone"]
    first = [(s, r) for r in rates for s in ("torchserve", "layerbatch")]
    second = [(s, r) for r in rates for s in ("layerbatch", "torchserve")]
    assert alone[: 4 * len(rates)] == first + second
    # then between the rates 1.15x apart around each crossing, each such rate in both rounds
    added = {s: [(a["rps"], a["why"]) for a in record["added"].get(s, [])] for s in record["knobs"]}
    assert alone[4 * len(rates) :] and all(
        (rate, "between") in added[s] for s, rate in alone[4 * len(rates) :]
    )
    assert [e for e in bench.log if e[0] == "warm"] == [("warm", rates[0])]
    assert bench.log.index(("warm", rates[0])) > max(
        i for i, e in enumerate(bench.log) if e[0] == "search"
    )

    results = {r["server"]: r for r in bench.results}
    assert set(results) == {"torchserve", "layerbatch"}
    for server, capacity in (("torchserve", 20.0), ("layerbatch", 30.0)):
        r = results[server]
        assert r["final"] == "2 rounds interleaved"
        assert r["crossing_rps"] == pytest.approx(CROSSING * capacity, rel=0.04)
        assert all(len(x["rounds"]) == 2 for x in r["runs"].values())
        assert all(x["requests"] == 200 for x in r["runs"].values())

    rows = table_rows(bench.results, {"resnet18": 40.0})
    (row,) = rows
    assert row["best_peer"] == "torchserve"
    expected = results["layerbatch"]["crossing_rps"] / results["torchserve"]["crossing_rps"]
    assert row["layerbatch_over_best_peer"] == pytest.approx(expected, abs=0.001)
    assert row["capacity_rps"]["layerbatch"] == results["layerbatch"]["crossing_rps"]
    assert "torchserve" in format_table(rows, st.servers)
    interval = final_interval(bench.finals, row, np.random.default_rng(0))
    assert interval is not None and interval.bound == ""
    assert interval.low <= interval.ratio <= interval.high
    saved = json.loads(checkpoint_path(st.out).read_text())
    assert saved["finals"] == json.loads(json.dumps(bench.finals))


def test_each_case_s_rounds_say_where_the_run_stands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A long run says which server it tunes and which case's rounds it starts, of how many,
    and the time so far."""
    st = dataclasses.replace(
        two_servers(tmp_path), deadlines=[300.0, 1000.0], arrivals=["poisson", "azure"]
    )
    asyncio.run(Rounds(st, checkpoint_path(st.out)).model("resnet18"))
    out = capsys.readouterr().out
    assert "[resnet18] torchserve (server 1 of 2, model 1 of 1; 0 h 0 min so far)" in out
    starts = [line for line in out.splitlines() if ": final rounds at " in line]
    assert [line.split(" (case ")[1].split(",")[0] for line in starts] == [
        f"{i} of 4" for i in range(1, 5)
    ]
    assert all(line.endswith("model 1 of 1; 0 h 0 min so far)") for line in starts)


def test_a_runner_up_that_won_its_settling_is_measured_around_the_best_capacity_tuned(
    tmp_path: Path,
) -> None:
    """TorchServe's B=4 (10 req/s) won the settling at B=8's 20 req/s: B=4 is measured, at
    rates placed from 20 req/s, where the settling found it on time."""
    st = two_servers(tmp_path)
    bench = Rounds(st, checkpoint_path(st.out))
    case = {"server": "torchserve", "model": "resnet18", "deadline_ms": 300.0}
    bench.settled.append({**case, "arrival": "poisson", "knobs": "B=4,5ms"})
    asyncio.run(bench.model("resnet18"))
    (record,) = bench.finals
    assert record["knobs"]["torchserve"] == "B=4,5ms"
    assert record["tuned_rps"]["torchserve"] == pytest.approx(20.0, rel=0.15)
    assert record["rates"][0] == pytest.approx(
        FINAL_SPAN[0] * record["tuned_rps"]["torchserve"], abs=0.05
    )


def test_a_server_beyond_the_rates_is_measured_further_out_in_growing_steps(
    tmp_path: Path,
) -> None:
    """layerbatch serves 1.5x what it was tuned at and TorchServe a fifth: neither crosses the
    threshold within the rates, so each is measured further out, alone, in both rounds, by
    EXTEND_BY, then its square, ...: layerbatch until it crosses (at its second), then between
    the two rates around its crossing until they are FINAL_STEP apart; TorchServe for
    MAX_EXTENSIONS rates, still under the threshold at its lowest rate, said so."""
    st = two_servers(tmp_path)
    bench = Rounds(st, checkpoint_path(st.out), speed={"layerbatch": 1.5, "torchserve": 0.2})
    asyncio.run(bench.model("resnet18"))
    (record,) = bench.finals
    rates = record["rates"]
    ours = sorted(float(r) for r in record["runs"]["layerbatch"])
    theirs = sorted(float(r) for r in record["runs"]["torchserve"])
    assert ours[: len(rates)] == rates and theirs[-len(rates) :] == rates
    added = [(a["rps"], a["why"]) for a in record["added"]["layerbatch"]]
    one, two = rates[-1] * EXTEND_BY, rates[-1] * EXTEND_BY**3
    assert added[:2] == [
        (pytest.approx(one, rel=0.01), "beyond"),
        (pytest.approx(two, rel=0.01), "beyond"),
    ]
    assert [why for _, why in added[2:]] == ["between"] * MAX_REFINES
    assert [why for a in record["added"]["torchserve"] for why in [a["why"]]] == ["beyond"] * 3
    assert theirs[0] == pytest.approx(rates[0] / EXTEND_BY**6, rel=0.01)
    assert all(len(v) == 2 for per in record["runs"].values() for v in per.values())
    results = {r["server"]: r for r in bench.results}
    assert results["layerbatch"]["crossing_rps"] == pytest.approx(CROSSING * 45.0, rel=0.03)
    assert results["torchserve"]["crossing_rps"] is None
    assert results["torchserve"]["capacity_rps"] == 0.0  # under the threshold at every rate
    (row,) = table_rows(bench.results, {"resnet18": 40.0})
    interval = final_interval(bench.finals, row, np.random.default_rng(0))
    assert interval is not None and interval.bound == "at least"
    assert row["capacity_text"]["torchserve"] == f"below {theirs[0]:g}"


def test_final_rounds_interrupted_go_on_where_they_stopped_and_end_the_same(
    tmp_path: Path,
) -> None:
    st = two_servers(tmp_path)
    whole = Rounds(dataclasses.replace(st, out=tmp_path / "whole.json"), tmp_path / "w.json")
    asyncio.run(whole.model("resnet18"))

    first = Rounds(st, checkpoint_path(st.out), stop_alone_at=7)
    with pytest.raises(Interrupted):
        asyncio.run(first.model("resnet18"))
    assert [e[0] for e in first.log[-2:]] == ["stop", "stop"]  # both servers stopped
    saved = json.loads(checkpoint_path(st.out).read_text())
    (partial,) = saved["finals"]
    assert not partial["complete"] and saved["results"] == []
    assert sum(len(v) for per in partial["runs"].values() for v in per.values()) == 6

    again = Rounds(dataclasses.replace(st, resume=True), checkpoint_path(st.out))
    resume(again, again.st)
    asyncio.run(again.model("resnet18"))
    assert not any(e[0] == "search" for e in again.log)  # the tuning is on record
    done = [(e[1], e[2]) for e in whole.log if e[0] == "alone"]
    assert [(e[1], e[2]) for e in again.log if e[0] == "alone"] == done[6:]
    assert again.finals == whole.finals and again.results == whole.results


def test_the_final_rounds_are_a_setting_and_zero_searches_each_capacity(tmp_path: Path) -> None:
    assert parse_args(["--quick"]).final_rounds == 2
    assert parse_args(["--quick", "--final-rounds", "0"]).final_rounds == 0
    with pytest.raises(SystemExit, match="--final-rounds: expected 0 or more, got -1"):
        parse_args(["--quick", "--final-rounds", "-1"])
    st = dataclasses.replace(two_servers(tmp_path), final_rounds=0)
    bench = Rounds(st, checkpoint_path(st.out))
    asyncio.run(bench.model("resnet18"))
    assert bench.finals == [] and not any(e[0] == "alone" for e in bench.log)
    assert {r["server"] for r in bench.results} == {"torchserve", "layerbatch"}
    assert all("final" not in r for r in bench.results)


def test_no_capacity_tuned_still_gives_rates_to_measure() -> None:
    record = new_record("resnet18", (300.0, "poisson"), {"triton": (Knobs(8, 5.0), 0.0, True)}, 2)
    assert record["rates"][0] > 0 and len(record["rates"]) == 4


def test_rounds_on_a_real_layerbatch_server(tmp_path: Path) -> None:
    """`measure_rounds` against a real layerbatch server on a small model: every rate in
    every round measured once over real sockets, each run's summary kept, none measured again
    when the rounds are asked for a second time."""
    from tests.server_cases import CIFAR, small_jpeg

    st = dataclasses.replace(
        parse_args(["--quick"]), logdir=tmp_path, duration_s=1.0, min_requests=5
    )
    bench = Bench(st, [small_jpeg(0)], np.zeros(1))
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    restarts: dict[str, list[dict[str, Any]]] = {}

    async def rounds() -> None:
        load = await bench.start("layerbatch", CIFAR, Knobs(), 1000.0)
        try:
            for _ in range(2):
                await measure_rounds(
                    bench, {"layerbatch": load}, {"layerbatch": [5.0, 10.0]}, "poisson", 1000.0,
                    2, runs, restarts,
                )  # fmt: skip
        finally:
            await bench.stop(load)

    asyncio.run(rounds())
    assert list(runs) == ["layerbatch"] and sorted(runs["layerbatch"]) == ["10", "5"]
    for rate, rounds_at in runs["layerbatch"].items():
        assert len(rounds_at) == 2 and restarts == {}
        for rnd, s in enumerate(rounds_at):
            arr, _ = bench.arrivals("poisson", float(rate), False, st.seed + rnd)
            assert s["requests"] == len(arr) and s["errors"] == 0
            assert s["on_time_ratio"] is not None and s["on_time_ratio"] > 0.5

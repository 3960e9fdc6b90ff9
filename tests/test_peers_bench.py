"""The pure parts of bench/peers.py (issue 9): tuning grid, summaries, the capacity search, the
Azure trace rescaling, the compute bound, the table and its ratios, and the wire formats. No peer
server runs here."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import torch

from bench.peers import parse_args
from bench.peers_arrivals import AZURE_TRACE, poisson_arrivals_s, trace_arrivals_s
from bench.peers_capacity import (
    RateSearch,
    batched_ceiling_rps,
    compute_bound_rps,
    mean_bound,
    speed_warning,
)
from bench.peers_final import round_line
from bench.peers_knobs import (
    Knobs,
    best_knobs,
    knobs_from_label,
    knobs_on_record,
    runner_up,
    settled,
    tuning_grid,
)
from bench.peers_load import ExitedEarly, Protocol, Run, Sample, summarize, triton_body
from bench.peers_profile import categorize, find_py_spy, profile_breakdown
from bench.peers_report import interleaved_results
from bench.peers_servers import (
    proc_stat,
    server_command,
    session_cpu_s,
    session_pids,
    signal_session,
)
from bench.peers_table import format_table, plot, table_rows
from bench.peers_tuning import Bench
from traces.arrivals import load_timestamps


def test_tuning_grid_is_the_product_with_batch_one_once() -> None:
    grid = tuning_grid([1, 4, 8, 16], [1, 5, 20])
    assert len(grid) == 1 + 3 * 3
    assert grid[0] == Knobs(1, 0.0)
    assert Knobs(16, 20.0) in grid and Knobs(4, 1.0) in grid
    assert [k.label for k in grid[:2]] == ["B=1", "B=4,1ms"]
    assert Knobs().label == "default"
    with_workers = tuning_grid([4, 8], [5], [1, 2])
    assert [k.label for k in with_workers] == ["B=4,5ms", "B=8,5ms", "B=4,5ms,2w", "B=8,5ms,2w"]
    assert Knobs(workers=2).label == "2 replicas"


def test_summarize_counts_only_answers_within_the_deadline() -> None:
    samples = [
        Sample(0.0, "ok", 100.0),
        Sample(0.1, "ok", 299.0),
        Sample(0.2, "ok", 301.0),  # answered, late
        Sample(0.3, "dropped", 5.0),
        Sample(0.4, "timeout", 300.0),
        Sample(0.5, "http-503", 2.0),
    ]
    s = summarize(samples, 300.0, 2.0)
    assert s["requests"] == 6
    assert s["on_time_ratio"] == pytest.approx(2 / 6, abs=1e-4)
    assert (s["served"], s["dropped"], s["timeouts"], s["errors"]) == (3, 1, 1, 1)
    assert s["mean_ms"] == pytest.approx(700.0 / 3, abs=0.01)
    assert s["goodput_rps"] == 1.0
    assert summarize([], 300.0, 1.0)["on_time_ratio"] is None


@pytest.mark.parametrize("start", [3.0, 10.0, 25.0, 80.0])
@pytest.mark.parametrize("true_cap", [7.3, 18.0, 41.0])
def test_rate_search_converges_to_the_capacity_within_the_tolerance(
    start: float, true_cap: float
) -> None:
    rs = RateSearch(start, tol=0.05)
    runs = 0
    while (r := rs.next_rate()) is not None:
        rs.record(r, r <= true_cap)
        runs += 1
    assert rs.capacity <= true_cap
    assert rs.capacity >= true_cap / 1.05 - 0.1
    assert runs <= 14


def test_rate_search_reports_zero_when_even_the_floor_fails() -> None:
    rs = RateSearch(4.0, tol=0.1, min_rate=0.5)
    while (r := rs.next_rate()) is not None:
        rs.record(r, False)
    assert rs.capacity == 0.0
    assert min(r for r, _ in rs.tried) == 0.5


def test_rate_search_with_a_floor_stops_at_a_failure_there_and_goes_on_above_it() -> None:
    rs = RateSearch(20.0, tol=0.1, floor=20.0)
    assert rs.next_rate() == 20.0
    rs.record(20.0, False)
    assert rs.below_floor and rs.next_rate() is None and rs.capacity == 0.0
    above, plain = RateSearch(20.0, tol=0.1, floor=20.0), RateSearch(20.0, tol=0.1)
    for rs in (above, plain):
        while (r := rs.next_rate()) is not None:
            rs.record(r, r <= 27.0)
    assert not above.below_floor and above.tried == plain.tried and above.capacity > 20.0


def test_rate_search_goes_from_an_on_time_start_to_then_and_grows_from_there() -> None:
    tie = RateSearch(20.0, tol=0.1, floor=20.0, then=22.0)
    for ok in (True, False):
        tie.record(tie.next_rate() or 0.0, ok)
    assert tie.tried == [(20.0, True), (22.0, False)] and tie.next_rate() is None
    better = RateSearch(20.0, tol=0.1, floor=20.0, then=22.0)
    for ok in (True, True):
        better.record(better.next_rate() or 0.0, ok)
    assert better.next_rate() == 33.0  # 22 x 1.5


def test_rate_search_uses_known_bounds_and_survives_a_noisy_inversion() -> None:
    rs = RateSearch(10.0, tol=0.1)
    rs.record(10.0, True)
    rs.record(20.0, False)
    assert rs.next_rate() == pytest.approx(14.1)
    rs.record(14.1, True)
    rs.record(12.0, False)  # noise: lower than a rate that was on time
    assert rs.hi == 12.0 and rs.lo == 10.0


def test_azure_trace_is_rescaled_to_the_mean_rate() -> None:
    ts = load_timestamps(AZURE_TRACE)
    full = trace_arrivals_s(ts, 20.0, ts.size, max_gap=np.inf)
    # the whole trace rescaled: n - 1 gaps of mean 1/20 s
    assert (ts.size - 1) / full[-1] == pytest.approx(20.0, rel=1e-6)
    assert full[0] == 0.0 and np.all(np.diff(full) >= 0)
    # bursty: the gaps vary far more than a Poisson process's (coefficient of variation 1)
    gaps = np.diff(full)
    assert gaps.std() / gaps.mean() > 1.5
    # twice the rate: the same arrivals, twice as dense; looped when more are asked for
    assert np.allclose(trace_arrivals_s(ts, 40.0, 300, np.inf), full[:300] / 2.0)
    looped = trace_arrivals_s(ts, 20.0, ts.size + 10)
    assert looped.size == ts.size + 10 and np.all(np.diff(looped) >= 0)


def test_azure_trace_idle_gaps_are_cut_and_bursts_kept() -> None:
    ts = load_timestamps(AZURE_TRACE)
    raw = trace_arrivals_s(ts, 5.0, 80, max_gap=np.inf)
    cut = trace_arrivals_s(ts, 5.0, 80)  # the first 80 hold a silence of minutes
    assert np.diff(raw).max() > 30.0 / 5.0
    assert np.diff(cut).max() == pytest.approx(30.0 / 5.0)
    short = np.diff(raw) < 30.0 / 5.0
    assert np.allclose(np.diff(cut)[short], np.diff(raw)[short])  # every burst as it was


def test_poisson_arrivals_are_seeded_and_at_the_rate() -> None:
    a = poisson_arrivals_s(50.0, 200.0, np.random.default_rng([1, 500]))
    b = poisson_arrivals_s(50.0, 200.0, np.random.default_rng([1, 500]))
    assert np.array_equal(a, b)
    assert a.size / 200.0 == pytest.approx(50.0, rel=0.05)
    assert a.max() < 200.0


def test_compute_bound_is_one_plain_request_at_a_time() -> None:
    assert compute_bound_rps(5.0, 20.0) == pytest.approx(40.0)
    assert compute_bound_rps(2.5, 30.8) == pytest.approx(1000.0 / 33.3)


def test_batched_ceiling_is_every_decode_plus_one_full_batch_forward() -> None:
    # 8 decodes of 2 ms and a batch-8 forward of 48 ms: 8 frames every 64 ms
    assert compute_bound_rps(2.0, 48.0, batch=8) == pytest.approx(125.0)
    measured = {
        "decode_ms": 2.0,
        "batched": {"8": 48.0, "16": 100.0},  # 125 and 121.2 req/s
        "batched_folded": {"8": 40.0, "16": 88.0},  # 142.9 and 133.3: folded batch 8 is best
    }
    assert batched_ceiling_rps(measured) == pytest.approx(8000.0 / 56.0)
    # one-thread lanes with their own decodes, where measured, when they serve more
    assert batched_ceiling_rps({**measured, "lanes_rps": 150.0}) == 150.0
    assert batched_ceiling_rps({**measured, "lanes_rps": 100.0}) == pytest.approx(8000.0 / 56.0)
    before = {"rps": 40.0, "batched_rps": 120.0}
    after = {"rps": 30.0, "batched_rps": 100.0}
    both = mean_bound(before, after)
    assert (both["rps"], both["batched_rps"]) == (35.0, 110.0)
    assert both["before"] is before and both["after"] is after
    assert both["speed_change"] == pytest.approx(100.0 / 120.0, abs=1e-3)


def test_a_run_warns_when_the_machine_changed_speed_during_it() -> None:
    steady = mean_bound({"rps": 40.0, "batched_rps": 100.0}, {"rps": 41.0, "batched_rps": 112.0})
    assert speed_warning(steady) is None  # 12%: within this machine's usual noise
    # the mobilenet_v2 run of 2026-11-22 at 1000 ms: 74.0 req/s before, 116.3 after
    moved = mean_bound({"rps": 51.7, "batched_rps": 74.0}, {"rps": 70.7, "batched_rps": 116.3})
    warning = speed_warning(moved)
    assert warning is not None
    assert "74.0 req/s before, 116.3 after, x1.57" in warning
    slower = mean_bound({"rps": 40.0, "batched_rps": 100.0}, {"rps": 30.0, "batched_rps": 80.0})
    assert speed_warning(slower) is not None and "x0.80" in (speed_warning(slower) or "")


def _result(server: str, cap: float, deadline: float = 300.0) -> dict[str, object]:
    return {
        "server": server,
        "model": "resnet18",
        "deadline_ms": deadline,
        "arrival": "poisson",
        "knobs": "default" if server == "layerbatch" else "B=8,5ms",
        "capacity_rps": cap,
        "runs": {},
    }


def test_table_ratio_is_layerbatch_over_the_best_peer() -> None:
    results = [
        _result("layerbatch", 26.0),
        _result("triton", 20.0),
        _result("ray", 12.5),
        _result("torchserve", 16.0),
        _result("layerbatch", 30.0, 1000.0),
        _result("triton", 0.0, 1000.0),
    ]
    rows = table_rows(results, {"resnet18": 32.5}, {"resnet18": 45.0})
    assert [(r["deadline_ms"]) for r in rows] == [300.0, 1000.0]
    first = rows[0]
    assert first["best_peer"] == "triton"
    assert first["layerbatch_over_best_peer"] == pytest.approx(1.3)
    assert first["fraction_of_bound"]["layerbatch"] == pytest.approx(0.8)
    assert first["fraction_of_bound"]["ray"] == pytest.approx(0.385, abs=1e-3)
    assert rows[1]["layerbatch_over_best_peer"] is None  # the best peer served nothing on time
    text = format_table(rows, ["layerbatch", "triton", "ray", "torchserve"])
    assert "1.30" in text and "26.0 (0.80)" in text and "triton" in text
    assert first["batched_ceiling_rps"] == 45.0 and "   45.0" in text
    assert table_rows(results, {"resnet18": 32.5})[0]["batched_ceiling_rps"] is None


def test_best_knobs_by_capacity_then_how_close_it_came() -> None:
    caps = {Knobs(4, 5.0): (10.0, 0.5), Knobs(8, 5.0): (12.0, 0.2), Knobs(8, 20.0): (12.0, 0.8)}
    assert best_knobs(caps) == Knobs(8, 20.0)


def test_the_runner_up_is_second_in_the_tunings_order_and_pairs_settle_between_them() -> None:
    a, b, c = Knobs(4, 5.0), Knobs(8, 5.0), Knobs(8, 20.0)
    caps = {a: (10.0, 0.5), b: (12.0, 0.2), c: (12.0, 0.8)}
    assert (best_knobs(caps), runner_up(caps)) == (c, b)
    assert runner_up({a: (10.0, 0.5), b: (10.0, 0.5)}) == b  # a tie keeps the grid's order
    assert best_knobs({a: (10.0, 0.5), b: (10.0, 0.5)}) == a
    assert runner_up({a: (10.0, 0.5)}) is None  # one knob: nothing to settle
    assert runner_up({a: (0.0, 0.3), b: (0.0, 0.1)}) is None  # neither ever held 0.9
    assert settled(c, b, {c: [0.9, 0.8, 0.85], b: [0.95, 0.9, 0.8]}) == b
    assert settled(c, b, {c: [0.9, 0.8], b: [0.8, 0.9]}) == c  # a tie: the tuning's pick
    with pytest.raises(SystemExit, match="--settle-pairs: expected 0 or more, got -1"):
        parse_args(["--quick", "--settle-pairs", "-1"])


def test_settling_measures_the_pick_and_its_runner_up_in_turn_on_the_same_arrivals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Bench.settle` starts both, then in each pair measures each alone on that pair's
    arrivals, the order alternating, and keeps the one with more on time; with settling off or
    nothing to settle against it returns the tuning's pick without starting anything."""
    from bench import peers_tuning
    from tests.server_cases import CIFAR, small_jpeg

    monkeypatch.setattr(peers_tuning, "WARM_LOAD_S", 0.5)
    st = dataclasses.replace(
        parse_args(["--quick"]),
        logdir=tmp_path,
        settle_pairs=2,
        tune_duration_s=1.0,
        min_requests=10,
        models=[CIFAR],
    )
    bench = Bench(st, [small_jpeg(i) for i in range(3)], np.zeros(2))
    one, two = Knobs(workers=1), Knobs(workers=2)
    caps = {one: (10.0, 0.5), two: (8.0, 0.7)}
    chosen = asyncio.run(bench.settle("layerbatch", CIFAR, (1000.0, "poisson"), caps, 1000.0))
    (record,) = bench.settled
    on_time = record["on_time"]
    assert record["tuning_pick"] == "default" and record["rate_rps"] == 10.0
    assert len(on_time["default"]) == len(on_time["2 replicas"]) == 2
    assert all(0.0 <= x <= 1.0 for x in on_time["default"] + on_time["2 replicas"])
    assert chosen == settled(one, two, {one: on_time["default"], two: on_time["2 replicas"]})
    assert record["knobs"] == chosen.label
    out = capsys.readouterr().out
    pairs = [m.groups() for m in re.finditer(r"layerbatch +(.+?) +pair (\d)", out)]
    assert pairs == [("default", "0"), ("2 replicas", "0"), ("2 replicas", "1"), ("default", "1")]
    assert f"{chosen.label} in pairs" in out

    def settle(b: Bench, caps: dict[Knobs, tuple[float, float]]) -> Knobs:
        return asyncio.run(b.settle("layerbatch", CIFAR, (1000.0, "poisson"), caps, 1000.0))

    assert settle(Bench(dataclasses.replace(st, settle_pairs=0), [], np.zeros(2)), caps) == one
    assert settle(Bench(st, [], np.zeros(2)), {two: (8.0, 0.7)}) == two
    assert len(list(tmp_path.glob("*.log"))) == 2  # neither of those started a server
    assert settle(bench, {two: (8.0, 0.7)}) == chosen  # this case is on record: as decided


def test_triton_body_is_kserve_v2_with_a_binary_bytes_element() -> None:
    jpeg = b"\xff\xd8hello\xff\xd9"
    body, headers = triton_body(jpeg)
    n = int(headers["Inference-Header-Content-Length"])
    header = json.loads(body[:n])
    assert header["inputs"][0]["datatype"] == "BYTES"
    assert header["inputs"][0]["parameters"]["binary_data_size"] == 4 + len(jpeg)
    assert struct.unpack("<I", body[n : n + 4])[0] == len(jpeg)
    assert body[n + 4 :] == jpeg


def test_answers_of_each_protocol() -> None:
    lb = Protocol("layerbatch", "resnet18")
    body, headers = lb.request(b"jpg", 300.0)
    assert msgpack.unpackb(body)["deadline_ms"] == 300.0
    assert headers["Content-Type"] == "application/msgpack"
    ok = msgpack.packb({"status": "ok", "result": {"top5": [{"class": 238}]}})
    assert lb.answer(200, ok) == ("ok", 238)
    assert lb.answer(200, msgpack.packb({"status": "dropped"})) == ("dropped", None)
    tr = Protocol("triton", "resnet18")
    doc = {"outputs": [{"name": "classes", "data": [238, 1, 2, 3, 4]}]}
    assert tr.answer(200, json.dumps(doc).encode()) == ("ok", 238)
    assert tr.answer(400, b"{}") == ("http-400", None)
    assert Protocol("ray", "resnet18").path == "/resnet18"
    ts = Protocol("torchserve", "resnet18")
    assert ts.path == "/predictions/resnet18"
    assert ts.answer(200, b'{"classes": [7, 1], "scores": [0.1]}') == ("ok", 7)
    assert ts.answer(200, b"not json") == ("error", None)


def test_profile_breakdown_attributes_samples_to_threads_and_categories() -> None:
    raw = [
        "process 1:python;thread (0x1);run (server/runtime.py:330);_call_impl "
        "(torch/nn/modules/module.py:1775);forward (torch/nn/modules/conv.py:554) 70",
        "process 1:python;thread (0x2);_decode (server/runtime.py:200);image_tensor "
        "(server/inputs.py:21) 20",
        "process 1:python;thread (0x3);run_forever (asyncio/base_events.py:600);plan "
        "(scheduler/engine.py:90) 8",
        "process 1:python;thread (0x3);select (selectors.py:468) 2",
        "garbage",
    ]
    out = profile_breakdown(raw)
    assert out["samples"] == 100
    assert out["threads"] == {"thread (0x1)": 70, "thread (0x2)": 20, "thread (0x3)": 10}
    assert out["categories"]["thread (0x1)"] == {"forward (torch modules)": 70}
    assert out["categories"]["thread (0x2)"] == {"decode (imdecode, resize, normalise)": 20}
    assert out["categories"]["thread (0x3)"] == {
        "planning (scheduler)": 8,
        "event loop (asyncio)": 2,
    }
    assert next(iter(out["top_self"])) == "forward (torch/nn/modules/conv.py:554)"
    assert categorize("x (somewhere.py:1)") == "other"


@pytest.mark.parametrize(
    "knobs",
    [Knobs(), Knobs(1, 0.0), Knobs(8, 5.0), Knobs(16, 1.5), Knobs(workers=2), Knobs(1, 0.0, 2),
     Knobs(8, 20.0, 2)],
)  # fmt: skip
def test_knobs_label_round_trips(knobs: Knobs) -> None:
    assert knobs_from_label(knobs.label) == knobs


def test_workers_split_the_same_threads_for_every_server() -> None:
    for server in ("layerbatch", "triton", "ray", "torchserve"):
        knobs = Knobs(workers=2) if server == "layerbatch" else Knobs(8, 5.0, 2)
        cmd, env = server_command(server, "resnet18", knobs, 300.0, 9000, "dp-tardy")
        assert env["PEERS_TORCH_THREADS"] == "1"
        if server == "layerbatch":
            assert cmd[cmd.index("--threads") + 1] == "1"
            assert cmd[cmd.index("--replicas") + 1] == "2"
        else:
            assert cmd[cmd.index("--workers") + 1] == "2"
    cmd, _ = server_command("layerbatch", "resnet18", Knobs(), 300.0, 9000, "dp-tardy")
    assert "--replicas" not in cmd


@pytest.mark.parametrize("fold", [False, True])
def test_every_server_gets_the_same_threads_and_fold_only_reaches_the_peers(fold: bool) -> None:
    for server in ("layerbatch", "triton", "ray", "torchserve"):
        cmd, env = server_command(server, "resnet18", Knobs(4, 5.0), 300.0, 9000, "dp-tardy", fold)
        assert env["PEERS_TORCH_THREADS"] == "2"
        if server == "layerbatch":
            assert cmd[cmd.index("--threads") + 1] == "2"
            assert "--no-fold-bn" not in cmd  # layerbatch folds by default, either way
        else:
            assert env["PEERS_FOLD_BN"] == ("1" if fold else "0")


def test_only_layerbatch_is_asked_for_a_step_log(tmp_path: Path) -> None:
    log = tmp_path / "s.steps.jsonl"
    for server in ("layerbatch", "triton", "ray", "torchserve"):
        cmd, _ = server_command(server, "resnet18", Knobs(), 300.0, 9000, "dp-tardy", False, log)
        if server == "layerbatch":
            assert cmd[cmd.index("--step-log") + 1] == str(log)
        else:
            assert "--step-log" not in cmd
    cmd, _ = server_command("layerbatch", "resnet18", Knobs(), 300.0, 9000, "dp-tardy")
    assert "--step-log" not in cmd


def test_a_peer_given_the_folded_model_answers_as_the_plain_one() -> None:
    from bench.peers_model import Model

    threads = torch.get_num_threads()
    try:  # Model sets torch's thread count for its process
        plain = Model("resnet18", fold_batch_norm=False)
        folded = Model("resnet18", fold_batch_norm=True)
    finally:
        torch.set_num_threads(threads)
    x = plain.decode(small_frame())[None]
    (c0, s0), (c1, s1) = plain.forward(x), folded.forward(x)
    assert c0.tolist() == c1.tolist()
    np.testing.assert_allclose(s0, s1, rtol=1e-4, atol=1e-6)


def small_frame() -> bytes:
    import cv2

    rgb = np.random.default_rng(0).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    ok, buf = cv2.imencode(".jpg", rgb)
    assert ok
    return bytes(buf)


def test_interleaved_runs_take_each_peers_tuned_knobs_from_the_per_model_tuning_files(
    tmp_path: Path,
) -> None:
    """The per-model quick runs (peers-quick-MODEL.json, and -*.json beside it: a tuning run at
    another deadline) count: the googlenet runs had fallen back to untuned knobs because only
    peers.json and peers-quick.json were read."""

    def doc(*rows: tuple[str, str, float, str]) -> str:
        keys = ("server", "model", "deadline_ms", "knobs")
        return json.dumps(
            {"results": [dict(zip(keys, r, strict=True), arrival="poisson") for r in rows]}
        )

    (tmp_path / "peers-quick.json").write_text(doc(("triton", "resnet18", 300.0, "B=8,5ms")))
    (tmp_path / "peers-quick-googlenet.json").write_text(
        doc(
            ("triton", "googlenet", 300.0, "B=4,20ms"),
            ("torchserve", "googlenet", 300.0, "B=8,20ms"),
        )
    )
    (tmp_path / "peers-quick-googlenet-1000ms.json").write_text(
        doc(("torchserve", "googlenet", 1000.0, "B=16,20ms"))
    )
    out = tmp_path / "peers.json"  # absent: no full run yet
    found = knobs_on_record(out, "googlenet", 300.0)
    assert found["triton"] == (
        Knobs(4, 20.0),
        "tuned under poisson arrivals at 300 ms, peers-quick-googlenet.json",
    )
    assert found["torchserve"][0] == Knobs(8, 20.0)
    assert "ray" not in found
    at_1000 = knobs_on_record(out, "googlenet", 1000.0)
    assert at_1000["torchserve"][0] == Knobs(16, 20.0)  # tuned at this deadline first
    assert at_1000["triton"] == (
        Knobs(4, 20.0),
        "tuned under poisson arrivals at 300 ms, peers-quick-googlenet.json",
    )
    assert knobs_on_record(out, "resnet18", 300.0)["triton"][0] == Knobs(8, 5.0)


def test_a_run_under_the_azure_trace_takes_knobs_tuned_under_it_else_says_they_were_not(
    tmp_path: Path,
) -> None:
    """Knobs tuned under Poisson arrivals need not be a peer's best under the bursty trace: an
    interleaved Azure run takes those tuned under the trace when there are any. Results from
    before per-arrival tuning (no "tuned_under") had Poisson-tuned knobs even when measured
    under the trace, and never count as tuned under it."""
    rows = [
        ("triton", "poisson", "poisson", "B=8,5ms"),
        ("triton", "azure", "azure", "B=4,20ms"),
        ("torchserve", "poisson", None, "B=4,5ms"),
        ("torchserve", "azure", None, "B=4,5ms"),  # measured under the trace, tuned under Poisson
        ("ray", "azure", "azure", "B=16,1ms"),
    ]
    keys = ("server", "arrival", "tuned_under", "knobs")
    results = [
        {**dict(zip(keys, r, strict=True)), "model": "mobilenet_v2", "deadline_ms": 300.0}
        for r in rows
    ]
    (tmp_path / "peers-quick-mobilenet_v2-azure.json").write_text(json.dumps({"results": results}))
    out = tmp_path / "peers.json"
    azure = knobs_on_record(out, "mobilenet_v2", 300.0, "azure")
    assert azure["triton"] == (
        Knobs(4, 20.0),
        "tuned under azure arrivals at 300 ms, peers-quick-mobilenet_v2-azure.json",
    )
    assert azure["ray"][0] == Knobs(16, 1.0)
    assert azure["torchserve"] == (
        Knobs(4, 5.0),
        "tuned under poisson arrivals at 300 ms, peers-quick-mobilenet_v2-azure.json",
    )
    poisson = knobs_on_record(out, "mobilenet_v2", 300.0)
    assert poisson["triton"][0] == Knobs(8, 5.0)
    assert "ray" not in poisson  # tuned under the trace only


def test_knobs_tuned_on_fewer_of_the_traces_arrivals_than_the_run_measures_say_so(
    tmp_path: Path,
) -> None:
    """The trace's first 150 arrivals and its first 200 hold different bursts, so knobs tuned on
    one count are said to be tuned on it, and a run on another count is told it differs."""
    result = {
        "server": "triton", "model": "resnet18", "deadline_ms": 1000.0, "arrival": "azure",
        "tuned_under": "azure", "knobs": "B=8,5ms,2w",
    }  # fmt: skip
    doc = {"settings": {"min_requests": 150}, "results": [result]}
    (tmp_path / "peers-quick-resnet18-azure.json").write_text(json.dumps(doc))
    out = tmp_path / "peers.json"
    tuned = "tuned under azure arrivals at 1000 ms on its first 150"
    file = ", peers-quick-resnet18-azure.json"
    same = knobs_on_record(out, "resnet18", 1000.0, "azure", 150)["triton"]
    assert same == (Knobs(8, 5.0, 2), tuned + file)
    more = knobs_on_record(out, "resnet18", 1000.0, "azure", 200)["triton"]
    assert more == (Knobs(8, 5.0, 2), tuned + ", not this run's 200" + file)
    result["arrival"] = result["tuned_under"] = "poisson"  # Poisson tunings carry no count
    (tmp_path / "peers-quick-resnet18-azure.json").write_text(json.dumps(doc))
    poisson = knobs_on_record(out, "resnet18", 1000.0, "poisson", 200)["triton"][1]
    assert poisson == "tuned under poisson arrivals at 1000 ms" + file


def test_layerbatch_takes_its_replicas_from_record_only_where_they_were_tuned(
    tmp_path: Path,
) -> None:
    """layerbatch's runs at one given replica count (no "tuned_under") say nothing of its best
    count; a run tuned over counts does, as a peer's tuning run does."""
    rows = [
        ("layerbatch", 1000.0, None, "default"),  # measured untuned, on one runtime
        ("layerbatch", 300.0, "poisson", "2 replicas"),
        ("triton", 300.0, "poisson", "B=8,5ms,2w"),
    ]
    keys = ("server", "deadline_ms", "tuned_under", "knobs")
    results = [
        {**dict(zip(keys, r, strict=True)), "model": "resnet18", "arrival": "poisson"} for r in rows
    ]
    (tmp_path / "peers-quick-resnet18-t.json").write_text(json.dumps({"results": results}))
    out = tmp_path / "peers.json"
    at_1000 = knobs_on_record(out, "resnet18", 1000.0)
    assert at_1000["layerbatch"][0] == Knobs(workers=2)  # tuned at 300 ms, not the untuned row
    assert at_1000["triton"][0] == Knobs(8, 5.0, 2)
    results.pop(1)
    (tmp_path / "peers-quick-resnet18-t.json").write_text(json.dumps({"results": results}))
    assert "layerbatch" not in knobs_on_record(out, "resnet18", 1000.0)


def test_interleaved_capacity_is_the_highest_rate_up_to_which_every_mean_is_on_time() -> None:
    doc: dict[str, Any] = {
        "model": "resnet18",
        "deadline_ms": 300.0,
        "rounds": 2,
        "fold_peers": True,
        "knobs": {"layerbatch": "default", "triton": "B=8,5ms"},
        "mean_on_time": {
            "layerbatch": {"26": 0.96, "30": 0.95, "34": 0.91, "38": 0.78},
            "triton": {"26": 0.83, "30": 0.61, "34": 0.92, "38": 0.3},  # a noisy 34
        },
    }
    rows = {r["server"]: r for r in interleaved_results(doc)}
    assert rows["layerbatch"]["capacity_rps"] == 34.0
    assert rows["triton"]["capacity_rps"] == 0.0  # 26 failed: a lower failure is trusted
    assert rows["triton"]["knobs"] == "B=8,5ms, folded"
    assert rows["layerbatch"]["knobs"] == "default"
    assert rows["triton"]["runs"]["30"] == {"on_time_ratio": 0.61}
    assert rows["layerbatch"]["crossing_rps"] == pytest.approx(34 + 4 * 0.01 / 0.13, abs=0.05)
    assert rows["triton"]["crossing_rps"] is None  # below the lowest rate measured
    assert rows["triton"]["arrival"] == "poisson, 2 rounds interleaved"  # before "arrival"
    doc["arrival"] = "azure"
    assert interleaved_results(doc)[0]["arrival"] == "azure, 2 rounds interleaved"
    doc["mean_on_time"]["triton"] = {"30": 0.95, "26": 0.97, "34": 0.5}  # any order
    assert interleaved_results(doc)[1]["capacity_rps"] == 30.0
    assert interleaved_results(doc)[1]["crossing_rps"] == pytest.approx(
        30 + 4 * 0.05 / 0.45, abs=0.05
    )


def test_the_plot_draws_one_line_per_server_and_the_bound_and_ceiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.pyplot as plt

    doc = {
        "model": "resnet18",
        "deadline_ms": 1000.0,
        "rounds": 2,
        "knobs": {"layerbatch": "default", "torchserve": "B=8,5ms"},
        "mean_on_time": {
            "layerbatch": {"38": 1.0, "44": 0.95, "50": 0.87},
            "torchserve": {"38": 1.0, "44": 0.37, "50": 0.12},
        },
    }
    drawn: list[list[str]] = []
    save = plt.Figure.savefig

    def keep_labels(fig: plt.Figure, *args: Any, **kwargs: Any) -> None:
        legend = fig.axes[0].get_legend()
        assert legend is not None
        drawn.append([t.get_text() for t in legend.get_texts()])
        save(fig, *args, **kwargs)

    path = tmp_path / "peers.png"
    monkeypatch.setattr(plt.Figure, "savefig", keep_labels)
    plot(interleaved_results(doc), {"resnet18": 36.0}, path, {"resnet18": 49.1})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn[0] == [
        "layerbatch (default): 47.8",  # where its mean crosses 0.9
        "torchserve (B=8,5ms): 39",
        "compute bound",
        "batched ceiling",
    ]
    # the Azure trace: capacities a tenth of the bound, whose lines would squeeze the curves
    doc["mean_on_time"] = {"layerbatch": {"4": 1.0, "6": 0.8}, "torchserve": {"4": 0.95, "6": 0.5}}
    plot(interleaved_results(doc), {"resnet18": 36.0}, path, {"resnet18": 49.1})
    assert drawn[1][2:] == [
        "compute bound 36 req/s, off the axis",
        "batched ceiling 49 req/s, off the axis",
    ]
    # no crossing among the rates measured: said as a bound, never as a capacity of 0
    doc["mean_on_time"] = {
        "layerbatch": {"38": 1.0, "44": 0.95},
        "torchserve": {"38": 0.5, "44": 0.2},
    }
    plot(interleaved_results(doc), {"resnet18": 36.0}, path, {"resnet18": 49.1})
    assert drawn[2][:2] == ["layerbatch (default): 44 or more", "torchserve (B=8,5ms): below 38"]


def test_a_capacity_search_starts_near_the_capacities_found_for_its_arrival_process() -> None:
    """Under the Azure trace capacity is about a tenth of the compute bound: a search there
    starts below what was found under it so far (else under Poisson), not at the bound."""
    bench = Bench(parse_args(["--quick"]), [], np.zeros(2))
    assert bench._start_rate("resnet18", 300.0, "poisson", 33.0) == 33.0  # nothing found yet
    assert bench._start_rate("resnet18", 300.0, "azure", 33.0) == 33.0
    bench.tuning.append(
        {"model": "resnet18", "deadline_ms": 300.0, "arrival": "poisson", "capacity_rps": 40.0}
    )
    assert bench._start_rate("resnet18", 300.0, "poisson", 33.0) == pytest.approx(32.0)
    assert bench._start_rate("resnet18", 300.0, "azure", 33.0) == pytest.approx(32.0)
    assert bench._start_rate("resnet18", 1000.0, "poisson", 33.0) == 33.0  # another deadline
    bench.results.append(
        {"model": "resnet18", "deadline_ms": 300.0, "arrival": "azure", "capacity_rps": 5.0}
    )
    bench.tuning.append(
        {"model": "resnet18", "deadline_ms": 300.0, "arrival": "azure", "capacity_rps": 4.0}
    )
    assert bench._start_rate("resnet18", 300.0, "azure", 33.0) == pytest.approx(4.0)


def test_a_trace_run_sends_the_same_arrivals_at_every_rate_compressed() -> None:
    """At every rate the trace's first --min-requests arrivals, rescaled: a count that grew
    with the rate (as Poisson's does with a fixed duration) would bring different bursts into
    the faster runs. Poisson runs last the set duration and hold at least that many."""
    bench = Bench(
        parse_args(["--quick", "--min-requests", "200"]), [], load_timestamps(AZURE_TRACE)
    )
    slow, slow_s = bench.arrivals("azure", 10.0, False, 1)
    fast, fast_s = bench.arrivals("azure", 40.0, False, 1)
    assert len(slow) == len(fast) == 200
    assert np.allclose(fast, slow / 4.0)
    assert (slow_s, fast_s) == (float(slow[-1]), float(fast[-1]))
    poisson, poisson_s = bench.arrivals("poisson", 40.0, False, 1)
    assert poisson_s == 12.0 and len(poisson) > 400  # quick: 12 s at 40 req/s
    few, few_s = bench.arrivals("poisson", 5.0, True, 1)
    assert few_s == 40.0 and len(few) > 150  # 200 requests at 5 req/s take 40 s


def test_a_paused_session_uses_no_cpu_until_it_is_continued() -> None:
    """--interleave stops the idle servers' whole sessions and counts their CPU: a busy child in
    a process group of its own (as Ray's workers are) is in its parent's session; their CPU grows
    while they run, stands still while the session is stopped, then grows again."""
    child = "import os; os.setpgid(0, 0)\nwhile 1: pass"
    parent = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {child!r}])"
    proc = subprocess.Popen(
        [sys.executable, "-c", parent + "\nwhile 1: pass"], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 20.0
        while len(session_pids(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(session_pids(proc.pid)) == 2
        t0 = session_cpu_s(proc.pid)
        while session_cpu_s(proc.pid) < t0 + 0.2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert session_cpu_s(proc.pid) >= t0 + 0.2
        signal_session(proc.pid, signal.SIGSTOP)
        while not all(proc_stat(p)[0] == "T" for p in session_pids(proc.pid)):
            assert time.monotonic() < deadline, "the session did not stop"
            time.sleep(0.01)
        paused_s = session_cpu_s(proc.pid)
        time.sleep(0.5)
        assert session_cpu_s(proc.pid) == paused_s
        signal_session(proc.pid, signal.SIGCONT)
        while session_cpu_s(proc.pid) < paused_s + 0.2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert session_cpu_s(proc.pid) >= paused_s + 0.2
    finally:
        signal_session(proc.pid, signal.SIGKILL)
        proc.wait()


def test_layerbatch_is_tuned_over_replica_counts_like_the_peers_over_workers() -> None:
    assert parse_args(["--quick"]).layerbatch_replicas == (1, 2)
    assert parse_args(["--quick", "--layerbatch-replicas", "2,1,2"]).layerbatch_replicas == (1, 2)
    with pytest.raises(SystemExit, match="--layerbatch-replicas: expected 1 to 2, got 3"):
        parse_args(["--quick", "--layerbatch-replicas", "1,3"])


def test_a_server_that_exits_while_starting_is_started_again_then_given_up_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`Bench.start` starts a server that exits before its first answer once more, then raises
    with the server's own last words; each start has its log and nothing is recorded as up."""
    st = dataclasses.replace(parse_args(["--quick"]), logdir=tmp_path, policy="no-such-policy")
    bench = Bench(st, [b"not a jpeg"], np.zeros(1))
    with pytest.raises(ExitedEarly, match="invalid choice: 'no-such-policy'"):
        asyncio.run(bench.start("layerbatch", "resnet18", Knobs(), 300.0, tries=2))
    assert capsys.readouterr().out.count("while starting") == 1
    assert len(list(tmp_path.glob("layerbatch-resnet18-*.log"))) == 2
    assert bench.checks == {}


def test_a_server_that_exits_while_starting_once_is_started_again_and_comes_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Bench.start`'s first start finds its port taken (a socket listens there) and exits; the
    second, on a free port, comes up and answers: the retry is said once, each start has its
    log, and the server is recorded as up after two starts."""
    import socket

    from bench import peers_servers
    from tests.server_cases import CIFAR, small_jpeg

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = [int(held.getsockname()[1])]
        real_free_port = peers_servers.free_port
        monkeypatch.setattr(
            peers_servers,
            "free_port",
            lambda span=5: taken.pop() if taken else real_free_port(span),
        )
        st = dataclasses.replace(parse_args(["--quick"]), logdir=tmp_path)
        bench = Bench(st, [small_jpeg(0)], np.zeros(1))

        async def start_and_stop() -> None:
            load = await bench.start("layerbatch", CIFAR, Knobs(), 1000.0, tries=2)
            await bench.stop(load)

        asyncio.run(start_and_stop())
    out = capsys.readouterr().out
    assert out.count("while starting") == 1 and "ready in" in out
    logs = sorted(tmp_path.glob(f"layerbatch-{CIFAR}-*.log"), key=lambda p: p.stat().st_mtime)
    assert len(logs) == 2
    assert "address already in use" in logs[0].read_text()  # in one line, no traceback
    assert "Traceback" not in logs[0].read_text()
    assert bench.checks[CIFAR]["layerbatch"]["starts"] == 2


def test_a_server_that_dies_between_rounds_is_said_and_started_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`Bench.revive` leaves a running server alone; once its server has died (Triton's Python
    backend once segfaulted under load, and the rounds after it measured a dead server as 0 on
    time, saying nothing), it says so and starts the same server again in the same load, which
    answers."""
    from tests.server_cases import CIFAR, small_jpeg

    st = dataclasses.replace(parse_args(["--quick"]), logdir=tmp_path)
    bench = Bench(st, [small_jpeg(0)], np.zeros(1))

    async def die_and_revive() -> tuple[bool, bool, int | None, str]:
        load = await bench.start("layerbatch", CIFAR, Knobs(), 1000.0)
        first = load.run
        try:
            kept = not await bench.revive(load, 2.0) and load.run is first
            signal_session(first.proc.pid, signal.SIGKILL)
            first.proc.wait()
            fresh = await bench.revive(load, 2.0) and load.run is not first
            status, _, top1 = await load.one(0, 30.0)
            return kept, fresh, top1, status
        finally:
            await bench.stop(load)

    kept, fresh, top1, status = asyncio.run(die_and_revive())
    assert kept and fresh and status == "ok" and top1 is not None
    out = capsys.readouterr().out
    assert out.count("while serving") == 1 and out.count("ready in") == 2
    assert len(list(tmp_path.glob(f"layerbatch-{CIFAR}-*.log"))) == 2


def test_a_server_that_dies_during_a_tuning_run_is_started_again_and_measured_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capacity search's run (`Bench.measure`) during which the server dies is not kept as
    the server's failure at that rate: the server is started again and the rate measured again,
    and the run kept is the new server's, every request answered. A run whose server died
    says so in its summary."""
    from bench import peers_tuning
    from tests.server_cases import CIFAR, small_jpeg

    monkeypatch.setattr(peers_tuning, "WARM_LOAD_S", 0.5)
    st = dataclasses.replace(
        parse_args(["--quick"]), logdir=tmp_path, tune_duration_s=2.0, min_requests=10
    )
    bench = Bench(st, [small_jpeg(0)], np.zeros(1))

    async def killed_during_the_run() -> tuple[Run, bool]:
        load = await bench.start("layerbatch", CIFAR, Knobs(), 1000.0)
        first = load.run

        async def kill_soon() -> None:
            await asyncio.sleep(0.5)
            signal_session(first.proc.pid, signal.SIGKILL)

        killer = asyncio.create_task(kill_soon())
        try:
            run = await bench.measure(load, {}, "poisson", 10.0, True)
            return run, load.run is not first
        finally:
            await killer
            await bench.stop(load)

    run, restarted = asyncio.run(killed_during_the_run())
    s = run.summary(1000.0)
    assert restarted and run.server_exited is None and "server_exited" not in s
    assert s["requests"] == len(bench.arrivals("poisson", 10.0, True, st.seed)[0])
    assert s["errors"] == 0
    out = capsys.readouterr().out
    assert out.count("during its run at 10 req/s; measuring that rate again") == 1
    assert out.count("while serving") == 1
    died = Run([Sample(0.0, "ok", 5.0), Sample(0.1, "error", 1.0)], 1.0, -9)
    assert died.summary(1000.0)["server_exited"] == -9


def test_a_rounds_line_says_its_errors_and_a_server_that_died() -> None:
    samples = [Sample(0.0, "ok", 10.0), Sample(0.1, "http-503", 1.0), Sample(0.2, "error", 1.0)]
    s = summarize(samples, 300.0, 1.0) | {"others_cpu_s": {"triton": 0.3}, "client_cpu_share": 0.03}
    assert "errors" not in round_line({**s, "errors": 0})
    line = round_line({**s, "server_exited": -11})
    assert line.startswith("on-time 0.333 ")
    assert "errors 2 SERVER EXITED (-11) others' CPU 0.3 s client 3% of a core" in line


def test_profile_finds_py_spy_beside_python_or_says_where_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(SystemExit, match=r"py-spy is neither beside .*\.venv-peers/bin/python"):
        find_py_spy(python)
    (python.parent / "py-spy").write_text("")
    assert find_py_spy(python) == python.parent / "py-spy"

"""PPipe's data plane (issue 8, paper 004 section 5.4 and A.3): reservation tables, the simulated
plane under the ppipe and reactive policies, and `layerbatch pipeline sim`.

Only bundled data is used (traces/data/profiles/cloud/ppipe*, the bundled Azure trace). Expected
latencies in the hand-checked cases are sums of the profiled block times read here.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import layerbatch
from scheduler.errors import InputError
from scheduler.pipeline.milp import Cluster
from scheduler.pipeline.profiles import ModelProfiles, load_model_profiles
from sim.pipeline_layout import place
from sim.pipeline_plan_file import plan_from_json
from sim.pipeline_plane import (
    LOAD_FACTORS,
    PlaneConfig,
    arrivals_ms,
    load_factor_sweep,
    run_plane,
    simulate,
    summarise,
)
from sim.reservation import DOWNLINK, GPU, UPLINK, ReservationTable, StageSpec, Worker
from tests.sim_cases import REPO

CLOUD = REPO / "traces" / "data" / "profiles" / "cloud"
MODEL = "repvgg-b3"
CLUSTER_DOC = {
    "gpus": {"L4": {"count": 2, "per_server": 2}, "T4": {"count": 4, "per_server": 2}},
    "nic_gbps": 10,
}
EXACT = PlaneConfig(noise_sigma=0.0, guard=0.0)


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return Cluster.from_json(CLUSTER_DOC)


@pytest.fixture(scope="module")
def profiles() -> ModelProfiles:
    return load_model_profiles(
        CLOUD / "ppipe", MODEL, gpus=["L4", "T4"], transfer_dir=CLOUD / "ppipe-transfer-sizes"
    )


def plan_doc(*pipes: tuple[int, float, list[tuple[int, int, str, int, int]]]) -> dict[str, Any]:
    """(batch, throughput, [(start, stop, gpu, mps, workers)]) per pipeline -> a plan document."""
    return {
        "throughput_rps": sum(rate for _, rate, _ in pipes),
        "status": "optimal",
        "gap": 0.0,
        "solve_s": None,
        "pipelines": [
            {
                "gpus": [g for _, _, g, _, _ in parts],
                "batch": batch,
                "throughput_rps": rate,
                "latency_ms": 0.0,
                "partitions": [
                    {"blocks": [i, j], "gpu": g, "mps": m, "workers": w, "gpus_used": w / m}
                    for i, j, g, m, w in parts
                ],
            }
            for batch, rate, parts in pipes
        ],
    }


# The plan `layerbatch pipeline plan --cluster CLUSTER_DOC --slo-ms 48.98 --margin 0.4` makes.
EXAMPLE = plan_doc(
    (2, 108.5, [(0, 10, "L4", 1, 1)]),
    (1, 197.7, [(0, 4, "T4", 1, 4), (4, 10, "L4", 1, 1)]),
)
EXAMPLE_SLO_MS = 48.98


def transfer_ms(profiles: ModelProfiles, cut_after_block: int, batch: int) -> float:
    return batch * profiles.cut_bytes[cut_after_block] * 8 / 10e9 * 1000.0


# --- reservation tables -----------------------------------------------------------------------


def naive_earliest(table: ReservationTable, resources: list[int], t: float, dur: float) -> float:
    """Oracle: the least candidate start (t or an interval end after it) free on all resources."""
    busy = [iv for r in resources for iv in table.intervals(r)]
    candidates = sorted({t} | {e for _, e in busy if e > t})
    for s in candidates:
        if all(not (s < e and a < s + dur) for a, e in busy):
            return s
    raise AssertionError("unreachable: after the last end everything is free")


def check_table(table: ReservationTable) -> None:
    for r in range(table.resources):
        ivs = table.intervals(r)
        for (a0, e0), (a1, e1) in itertools.pairwise(ivs):
            assert a0 < e0 <= a1 + 1e-9 and a1 < e1, f"resource {r}: {ivs}"


def small_pipeline(servers: list[list[int]]) -> tuple[list[list[Worker]], int]:
    """Pools whose workers sit on the given servers; resources numbered like the layout."""
    n_workers = sum(len(pool) for pool in servers)
    pools, r = [], 0
    for pool in servers:
        workers = []
        for s in pool:
            workers.append(Worker(r, s, n_workers + 2 * s, n_workers + 2 * s + 1))
            r += 1
        pools.append(workers)
    n_servers = 1 + max(s for pool in servers for s in pool)
    return pools, n_workers + 2 * n_servers


pool_servers = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=3), min_size=1, max_size=3)
ops = st.lists(
    st.tuples(
        st.floats(0, 5),  # time advance
        st.lists(st.floats(0.1, 4), min_size=3, max_size=3),  # compute per stage
        st.floats(0, 2),  # transfer time
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(pool_servers, ops)
def test_probe_reserve_properties(servers: list[list[int]], steps: list[Any]) -> None:
    pools, resources = small_pipeline(servers)
    table = ReservationTable(resources)
    now = 0.0
    for advance, compute, net in steps:
        now += advance
        stages = [
            StageSpec(tuple(pool), compute[d], net, frozenset(w.server for w in pool))
            for d, pool in enumerate(pools)
        ]
        before = [table.intervals(r) for r in range(resources)]
        pr = table.probe(stages, now)
        assert [table.intervals(r) for r in range(resources)] == before  # probe changes nothing
        # The path is consistent: each slot free, stages in order, transfers on both links at once.
        t = now
        gpu_slots = [s for s in pr.slots if s.kind == GPU]
        assert [s.stage for s in gpu_slots] == list(range(len(pools)))
        for s in pr.slots:
            assert naive_earliest(table, [s.resource], s.start_ms, s.end_ms - s.start_ms) == (
                s.start_ms
            )
            if s.kind == UPLINK:
                assert s.start_ms >= t - 1e-9
            if s.kind == GPU:
                assert s.start_ms >= t - 1e-9
                t = s.end_ms
        ups = [s for s in pr.slots if s.kind == UPLINK]
        downs = [s for s in pr.slots if s.kind == DOWNLINK]
        assert [(u.start_ms, u.end_ms) for u in ups] == [(d.start_ms, d.end_ms) for d in downs]
        assert pr.finish_ms == pytest.approx(gpu_slots[-1].end_ms)
        # Greedy per stage: no worker of the pool would have finished that stage earlier.
        ready = now
        prev: Worker | None = None
        for d, pool in enumerate(pools):
            best = float("inf")
            for w in pool:
                s = ready
                if prev is not None and net > 0 and w.server != prev.server:
                    s = naive_earliest(table, [prev.uplink, w.downlink], s, net) + net
                best = min(best, naive_earliest(table, [w.gpu], s, compute[d]) + compute[d])
            assert gpu_slots[d].end_ms == pytest.approx(best)
            ready, prev = gpu_slots[d].end_ms, pool[pr.workers[d]]
        table.reserve(pr)
        check_table(table)
        for s in pr.slots:  # reserve then probe sees it (a slot of no length is not kept)
            assert (s.start_ms, s.end_ms) in table.intervals(s.resource) or s.end_ms == s.start_ms
        again = table.probe(stages, now)  # (the greedy path need not finish later: no check)
        for s in again.slots:
            for r in pr.slots:
                if r.resource == s.resource:
                    assert s.end_ms <= r.start_ms + 1e-9 or r.end_ms <= s.start_ms + 1e-9
        with pytest.raises(ValueError, match="stale"):
            table.reserve(pr)
        check_table(table)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.5, 3), min_size=1, max_size=12), st.floats(0.5, 1.6), st.floats(0, 2))
def test_feedback_keeps_reservations_apart(
    durations: list[float], factor: float, late_ms: float
) -> None:
    """Slots that really start late or run long push the later ones; finished ones go away."""
    table = ReservationTable(1)
    pool = (Worker(0, 0, 1, 2),)
    ids = []
    for dur in durations:
        pr = table.probe([StageSpec(pool, dur, 0.0)], 0.0)
        ids.extend(table.reserve(pr))
    check_table(table)
    now = 0.0
    for slot, dur in zip(ids, durations, strict=True):
        first_start = table.intervals(0)[0][0]
        now = max(now, first_start) + late_ms
        table.started(slot, now, dur)
        check_table(table)
        assert table.intervals(0)[0] == (now, now + dur)
        now += dur * factor
        table.finished(slot, now)
        check_table(table)
        rest = table.intervals(0)
        assert all(a >= now - 1e-9 for a, _ in rest)  # the finished slot is forgotten
    assert table.intervals(0) == []


def test_earliest_slot_on_two_links_needs_both_free() -> None:
    table = ReservationTable(3)

    def busy(resource: int, start_ms: float, duration_ms: float) -> None:
        pool = (Worker(resource, 0, 0, 0),)  # a one-stage probe reserves just `resource`
        table.reserve(table.probe([StageSpec(pool, duration_ms, 0.0)], start_ms))

    busy(0, 0.0, 4.0)
    busy(1, 0.0, 3.0)
    busy(2, 3.0, 2.0)
    assert table.earliest_ms([1, 2], 0.0, 1.0) == 5.0  # [3, 5) busy on 2 once 1 is free
    assert table.earliest_ms([1], 0.0, 1.0) == 3.0
    assert table.earliest_ms([2], 0.0, 3.0) == 0.0  # the gap [0, 3) is just long enough
    assert table.earliest_ms([2], 0.0, 3.5) == 5.0
    assert table.earliest_ms([0, 1], 0.0, 1.0) == 4.0


# --- the simulated data plane: hand-checked cases -----------------------------------------------


def exact_latencies(
    profiles: ModelProfiles,
    cluster: Cluster,
    doc: dict[str, Any],
    slo_ms: float,
    arrivals: np.ndarray,
    policy: str,
    config: PlaneConfig = EXACT,
) -> np.ndarray:
    plan = plan_from_json(doc, profiles, cluster)
    out = simulate(
        profiles, cluster, plan, slo_ms, arrivals, policy, np.random.default_rng(0), config
    )
    assert not out.dropped.any()
    return np.asarray(out.finish_ms - out.arrival_ms)


@pytest.mark.parametrize("policy", ["ppipe", "reactive"])
def test_one_partition_latency_is_the_profiled_time(
    profiles: ModelProfiles, cluster: Cluster, policy: str
) -> None:
    doc = plan_doc((1, 100.0, [(0, 10, "L4", 1, 1)]))
    arrivals = np.arange(1, 21) * 50.0
    lat = exact_latencies(profiles, cluster, doc, 100.0, arrivals, policy)
    whole = profiles.partition_latency_ms("L4", 1, 0, 10, 1)
    assert lat == pytest.approx(np.full(20, whole), abs=1e-9)


@pytest.mark.parametrize("policy", ["ppipe", "reactive"])
def test_two_partitions_add_the_nic_transfer(
    profiles: ModelProfiles, cluster: Cluster, policy: str
) -> None:
    doc = plan_doc((1, 50.0, [(0, 2, "T4", 1, 1), (2, 10, "L4", 1, 1)]))
    arrivals = np.arange(1, 11) * 60.0
    lat = exact_latencies(profiles, cluster, doc, 100.0, arrivals, policy)
    expect = (
        profiles.partition_latency_ms("T4", 1, 0, 2, 1)
        + transfer_ms(profiles, 1, 1)  # the cut after block 1, at 10 Gbit/s
        + profiles.partition_latency_ms("L4", 1, 2, 10, 1)
    )
    assert lat == pytest.approx(np.full(10, expect), abs=1e-9)
    # Both partitions on L4, and the two L4s share a server: the cut crosses no NIC.
    doc = plan_doc((1, 50.0, [(0, 2, "L4", 1, 1), (2, 10, "L4", 1, 1)]))
    lat = exact_latencies(profiles, cluster, doc, 100.0, arrivals, policy)
    local = profiles.partition_latency_ms("L4", 1, 0, 2, 1)
    local += profiles.partition_latency_ms("L4", 1, 2, 10, 1)
    assert lat == pytest.approx(np.full(10, local), abs=1e-9)


def test_ppipe_waits_for_a_full_batch_or_until_the_last_moment(
    profiles: ModelProfiles, cluster: Cluster
) -> None:
    doc = plan_doc((2, 100.0, [(0, 10, "L4", 1, 1)]))
    c1 = profiles.partition_latency_ms("L4", 1, 0, 10, 1)
    c2 = profiles.partition_latency_ms("L4", 1, 0, 10, 2)
    # Every 10 ms: the first of each pair waits for the second, then both run at batch 2.
    lat = exact_latencies(profiles, cluster, doc, 100.0, np.arange(1, 11) * 10.0, "ppipe")
    assert lat == pytest.approx(np.tile([10.0 + c2, c2], 5), abs=1e-9)
    # Every 200 ms (longer than the SLO): nobody comes, so it runs alone at the last moment.
    lat = exact_latencies(profiles, cluster, doc, 100.0, np.arange(1, 6) * 200.0, "ppipe")
    assert lat == pytest.approx(np.full(5, 100.0), abs=1e-9)
    # The reactive baseline never waits.
    lat = exact_latencies(profiles, cluster, doc, 100.0, np.arange(1, 6) * 200.0, "reactive")
    assert lat == pytest.approx(np.full(5, c1), abs=1e-9)


def test_feedback_correction_learns_a_slowdown(profiles: ModelProfiles, cluster: Cluster) -> None:
    """GPUs 20% slower than profiled: the EWMA learns 1.2, and with it requests that wait until
    the last moment finish on time; without it (a negligible weight) they are all late."""
    doc = plan_doc((2, 100.0, [(0, 2, "T4", 1, 1), (2, 10, "L4", 1, 1)]))
    plan = plan_from_json(doc, profiles, cluster)
    arrivals = np.arange(1, 41) * 200.0
    late = {}
    for ewma in (0.5, 1e-9):
        cfg = PlaneConfig(noise_sigma=0.0, slowdown=1.2, ewma=ewma, guard=0.01)
        out = simulate(
            profiles, cluster, plan, 100.0, arrivals, "ppipe", np.random.default_rng(0), cfg
        )
        res = summarise(out, cluster, "ppipe", "constant", 1.0, 5.0)
        assert res.requests == res.on_time + res.late + res.dropped
        late[ewma] = res.late + res.dropped
        if ewma == 0.5:
            assert out.correction[0] == pytest.approx((1.2, 1.2), abs=1e-6)
    assert late[1e-9] == 40
    assert late[0.5] <= 3


def test_utilisation_is_busy_time_over_gpus_and_duration(
    profiles: ModelProfiles, cluster: Cluster
) -> None:
    doc = plan_doc((1, 100.0, [(0, 10, "L4", 2, 1)]))  # one half of an L4
    plan = plan_from_json(doc, profiles, cluster)
    arrivals = np.arange(0, 40) * 25.0
    out = simulate(
        profiles,
        cluster,
        plan,
        100.0,
        arrivals,
        "reactive",
        np.random.default_rng(0),
        EXACT,
        1000.0,
    )
    res = summarise(out, cluster, "reactive", "constant", 1.0, 40.0)
    c1 = profiles.partition_latency_ms("L4", 1 * 2, 0, 10, 1)
    assert res.utilisation["L4"] == pytest.approx(40 * c1 / 2 / (2 * 1000.0))
    assert res.utilisation["T4"] == 0.0


# --- the simulated data plane: load ---------------------------------------------------------------


@pytest.mark.parametrize("policy", ["ppipe", "reactive"])
def test_attainment_high_at_low_load_and_falls_at_overload(
    profiles: ModelProfiles, cluster: Cluster, policy: str
) -> None:
    plan = plan_from_json(EXAMPLE, profiles, cluster)
    low = run_plane(
        profiles,
        cluster,
        plan,
        EXAMPLE_SLO_MS,
        policy,
        "poisson",
        0.2,
        5.0,
        np.random.default_rng(1),
    )
    high = run_plane(
        profiles,
        cluster,
        plan,
        EXAMPLE_SLO_MS,
        policy,
        "poisson",
        2.0,
        5.0,
        np.random.default_rng(1),
    )
    for res in (low, high):
        assert res.requests == res.on_time + res.late + res.dropped
        assert all(0.0 <= u <= 1.0 for u in res.utilisation.values())
        assert res.p50_ms is not None and res.p99_ms is not None and res.p50_ms <= res.p99_ms
    assert low.attainment >= 0.99
    assert high.attainment < 0.8
    assert high.dropped > 0
    assert high.utilisation["L4"] > low.utilisation["L4"]
    if policy == "ppipe":  # it admits only batches it expects on time: drops, not late
        assert high.late <= 0.01 * high.requests
        assert low.p99_ms <= EXAMPLE_SLO_MS


def test_ppipe_beats_reactive_on_the_bursty_trace(
    profiles: ModelProfiles, cluster: Cluster
) -> None:
    plan = plan_from_json(EXAMPLE, profiles, cluster)
    res = {
        policy: run_plane(
            profiles,
            cluster,
            plan,
            EXAMPLE_SLO_MS,
            policy,
            "trace",
            0.5,
            10.0,
            np.random.default_rng(2),
        )
        for policy in ("ppipe", "reactive")
    }
    assert res["ppipe"].requests == res["reactive"].requests  # the same arrivals
    assert res["ppipe"].attainment > res["reactive"].attainment + 0.1


def test_runs_are_deterministic_and_sweeps_cover_the_grid(
    profiles: ModelProfiles, cluster: Cluster
) -> None:
    plan = plan_from_json(EXAMPLE, profiles, cluster)

    def run(seed: int) -> object:
        rng = np.random.default_rng(seed)
        return run_plane(profiles, cluster, plan, EXAMPLE_SLO_MS, "ppipe", "poisson", 0.7, 3.0, rng)

    assert run(5) == run(5)
    sweep = load_factor_sweep(
        profiles,
        cluster,
        plan,
        EXAMPLE_SLO_MS,
        "ppipe",
        "poisson",
        1.0,
        np.random.default_rng(0),
        factors=(0.1, 0.5, 3.0),
    )
    assert [p.load_factor for p in sweep.points] == [0.1, 0.5, 3.0]
    assert sweep.points[0].attainment >= 0.99 > sweep.points[2].attainment
    assert sweep.max_load_factor in (0.1, 0.5)
    assert LOAD_FACTORS[0] == 0.05 and LOAD_FACTORS[-1] == 1.0 and len(LOAD_FACTORS) == 20


def test_arrivals_fill_the_window_at_the_rate() -> None:
    rng = np.random.default_rng(0)
    for kind in ("poisson", "trace", "pareto", "constant"):
        arr = arrivals_ms(kind, 200.0, 20.0, rng)
        assert arr.size > 0 and arr[-1] < 20000.0 and np.all(np.diff(arr) >= 0)
        if kind in ("poisson", "constant"):
            assert arr.size == pytest.approx(4000, rel=0.05)


# --- layout and plan files --------------------------------------------------------------------


def test_layout_packs_virtual_gpus_onto_servers(profiles: ModelProfiles, cluster: Cluster) -> None:
    doc = plan_doc((1, 10.0, [(0, 4, "T4", 2, 3), (4, 10, "L4", 4, 4)]))
    layout = place(plan_from_json(doc, profiles, cluster), cluster)
    t4, l4 = layout.pools[0]
    # 3 halves of T4: GPUs 0, 0, 1 -> all on the first T4 server; 4 quarters: one L4.
    assert len({w.server for w in t4.workers}) == 1
    assert len({w.server for w in l4.workers}) == 1
    assert t4.workers[0].server != l4.workers[0].server
    assert layout.resources == 7 + 2 * 3  # 7 workers, 3 servers (1 for L4, 2 for T4)
    assert len({w.gpu for w, _ in layout.workers()}) == 7


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d["pipelines"][0]["partitions"][0].update(gpu="H100"), "H100"),
        (lambda d: d["pipelines"][0]["partitions"][0].update(workers=3), "at most 2 L4"),
        (lambda d: d["pipelines"][0]["partitions"][0].update(blocks=[0, 9]), "covering all"),
        (lambda d: d["pipelines"][0]["partitions"][0].pop("mps"), "mps"),
        (lambda d: d.pop("pipelines"), "pipelines"),
        (lambda d: d["pipelines"][0].update(batch=99), "batch of at most"),
    ],
)
def test_bad_plans_are_named(
    profiles: ModelProfiles, cluster: Cluster, mutate: Any, needle: str
) -> None:
    doc = json.loads(json.dumps(EXAMPLE))
    mutate(doc)
    with pytest.raises(InputError, match=needle):
        plan_from_json(doc, profiles, cluster, "p.json")


def test_a_multi_model_plan_gives_the_model_its_own_plan(
    profiles: ModelProfiles, cluster: Cluster
) -> None:
    doc = {"normalized_rps": 1.0, "models": {MODEL: {"share": 1.0, "slo_ms": 48.98, **EXAMPLE}}}
    plan = plan_from_json(doc, profiles, cluster)
    assert [p.batch for p in plan.pipelines] == [2, 1]
    with pytest.raises(InputError, match=f"a plan for model {MODEL} \\(it has other\\)"):
        plan_from_json({"models": {"other": EXAMPLE}}, profiles, cluster)


# --- the command line -------------------------------------------------------------------------


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = layerbatch.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_plan_then_sim(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps(CLUSTER_DOC))
    slo = str(EXAMPLE_SLO_MS)
    base = ["--cluster", str(cluster), "--slo-ms", slo]
    code, out, err = cli(["pipeline", "plan", *base, "--margin", "0.4", "--json"], capsys)
    assert code == 0, err
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    sim = ["pipeline", "sim", "--plan", str(plan), *base, "--duration-s", "5"]
    code, out, err = cli([*sim, "--load-factor", "0.5", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["requests"] == doc["on_time"] + doc["late"] + doc["dropped"] > 0
    assert doc["attainment"] >= 0.98 and set(doc["utilisation"]) == {"L4", "T4"}
    assert doc["rate_rps"] == pytest.approx(0.5 * json.loads(plan.read_text())["throughput_rps"])
    code, out, err = cli([*sim, "--policy", "reactive", "--arrival", "trace"], capsys)
    assert code == 0, err
    assert "attainment" in out and "utilisation: L4" in out
    code, out, err = cli([*sim[:-1], "1", "--sweep", "--json"], capsys)
    assert code == 0, err
    sweep = json.loads(out)
    assert [p["load_factor"] for p in sweep["points"]] == list(LOAD_FACTORS)
    passing = [p["load_factor"] for p in sweep["points"] if p["attainment"] >= 0.99]
    assert sweep["max_load_factor"] == (max(passing) if passing else None)


def test_cli_refuses_bad_plans_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps(CLUSTER_DOC))
    base = ["pipeline", "sim", "--cluster", str(cluster), "--slo-ms", "48.98", "--plan"]
    cases = {
        "missing.json": (None, "readable"),
        "nokeys.json": ({"throughput_rps": 5}, "pipelines"),
        "h100.json": (plan_doc((1, 5.0, [(0, 10, "H100", 1, 1)])), "H100"),
        "many.json": (plan_doc((1, 5.0, [(0, 10, "T4", 1, 5)])), "at most 4 T4"),
    }
    for name, (content, needle) in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_text(json.dumps(content))
        code, out, err = cli([*base, str(path)], capsys)
        assert code == 2 and out == ""
        assert needle in err and name in err and len(err.strip().splitlines()) == 1


def test_cli_refuses_a_negative_noise_sigma_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps(CLUSTER_DOC))
    args = ["pipeline", "sim", "--plan", str(cluster), "--cluster", str(cluster)]
    code, out, err = cli([*args, "--slo-ms", "48.98", "--noise-sigma", "-1"], capsys)
    assert code == 2 and out == ""
    assert "--noise-sigma" in err and ">= 0" in err and len(err.strip().splitlines()) == 1

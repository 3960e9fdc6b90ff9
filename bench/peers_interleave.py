"""`bench/peers.py --interleave`: every server up at once, measured in turn at each rate and
round on the same arrivals, with its best knobs on record."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import numpy as np

from bench.peers_capacity import mean_bound
from bench.peers_final import Runs, measure_rounds
from bench.peers_knobs import UNTUNED, Knobs, knobs_on_record
from bench.peers_load import Load
from bench.peers_report import mean_on_time, report_interleaved
from bench.peers_settings import Settings, layerbatch_grid
from bench.peers_tuning import Bench, machine_text


async def interleaved(
    st: Settings,
    frames: list[bytes],
    knobs: dict[str, Knobs],
    rates: list[float],
    rounds: int,
    trace: np.ndarray,
) -> dict[str, Any]:
    """Every server up at once; for each round and rate, each server in turn gets the same
    arrivals, so the machine's drift hits all alike. While one is measured the others are idle,
    and stopped (SIGSTOP) when `st.pause_idle`: an idle Ray Serve used 8-30% of a core during
    the others' runs. Each run's summary holds the CPU seconds each other server used during it
    ("others_cpu_s"). The arrivals are the first of `st.arrivals`: Poisson (new draws each
    round) or the Azure trace rescaled (the same arrivals each round). Each server first serves
    WARM_LOAD_S of Poisson arrivals at the first rate, not measured: its first batches under
    load (kernels for new batch sizes, a JIT) must not count against that rate (TorchServe was
    0.51-0.66 on time at its first rate, then 0.85-1.00 in the next round). The compute bound
    is measured before and after (no server up then). A server found dead before a measurement
    is started again and warmed up (`Bench.revive`), each restart recorded under "restarts"."""
    model, deadline, arrival = st.models[0], st.deadlines[0], st.arrivals[0]
    bench = Bench(st, frames, trace)
    loads: dict[str, Load] = {}
    out: dict[str, Any] = {
        "date": dt.date.today().isoformat(),
        "machine": machine_text(),
        "model": model,
        "deadline_ms": deadline,
        "arrival": arrival,
        "rounds": rounds,
        "fold_peers": st.fold_peers,
        "paused_idle": st.pause_idle,
        "compute_bound": {"before": await asyncio.to_thread(bench.compute_bound, model)},
    }
    runs: Runs = {s: {} for s in knobs}
    restarts: dict[str, list[dict[str, Any]]] = {}
    try:
        for server, k in knobs.items():
            loads[server] = await bench.start(server, model, k, deadline)
        await bench.warm(loads.values(), rates[0], deadline)
        wanted = {s: rates for s in knobs}
        await measure_rounds(bench, loads, wanted, arrival, deadline, rounds, runs, restarts)
    finally:
        for load in loads.values():
            await bench.stop(load)
    before = out["compute_bound"]["before"]
    out["compute_bound"] = mean_bound(before, await asyncio.to_thread(bench.compute_bound, model))
    if restarts:
        out["restarts"] = restarts
    out["knobs"] = {s: k.label for s, k in knobs.items()}
    out["runs"] = runs
    out["mean_on_time"] = mean_on_time(runs)
    return out


def interleaved_main(
    st: Settings, frames: list[bytes], trace: np.ndarray, rates: list[float], rounds: int
) -> None:
    model, deadline = st.models[0], st.deadlines[0]
    found = knobs_on_record(st.out, model, deadline, st.arrivals[0], st.min_requests)
    knobs: dict[str, Knobs] = {}
    sources: dict[str, str] = {}
    given = len(st.layerbatch_replicas) == 1  # one count given: it is used, not what's on record
    for s in st.servers:
        if s == "layerbatch" and (given or s not in found):
            knobs[s] = layerbatch_grid(st)[-1]
            sources[s] = "--layerbatch-replicas" if given else "no tuning run: the most replicas"
        else:
            knobs[s], sources[s] = found.get(s, (UNTUNED, "no tuning run"))
        print(f"  {s}: {knobs[s].label} ({sources[s]})", flush=True)
    doc = asyncio.run(interleaved(st, frames, knobs, rates, rounds, trace))
    doc["knobs_from"] = sources
    doc["load"] = {"duration_s": st.duration_s, "min_requests": st.min_requests, "seed": st.seed}
    path = st.out.with_name("peers-interleaved.json")
    path.write_text(json.dumps(doc, indent=1))
    report_interleaved(doc, path.with_suffix(".png"), np.random.default_rng(st.seed))
    print(f"wrote {path} and {path.with_suffix('.png')}")

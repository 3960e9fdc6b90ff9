"""The full benchmark of bench/peers.py (`Bench`): per model, each server's knobs tuned over its
grid and the pick settled against its runner-up in pairs; then every server's capacity at its
pick measured in interleaved rounds (bench/peers_final.py), or with --final-rounds 0 searched at
those knobs one server after another; and the server starts, restarts, warm-ups and
measurements every mode shares."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.lane_ceiling import LANE_BATCH, LANE_SECONDS, samples_per_s
from bench.peers_arrivals import arrivals_for, poisson_arrivals_s
from bench.peers_capacity import (
    RateSearch,
    batched_ceiling_rps,
    compute_bound_rps,
    mean_bound,
    speed_warning,
)
from bench.peers_crossing import THRESHOLD
from bench.peers_final import final_case
from bench.peers_knobs import (
    THREADS,
    Knobs,
    best_knobs,
    knobs_from_label,
    knobs_on_record,
    runner_up,
    settled,
)
from bench.peers_load import ExitedEarly, Load, Run, measure_alone
from bench.peers_servers import Running
from bench.peers_settings import Settings, layerbatch_grid

ROOT = Path(__file__).resolve().parent.parent
WARM_LOAD_S = 8.0  # --interleave: unmeasured load each server serves first

Case = tuple[float, str]  # (deadline in ms, arrival process)
Cache = dict[float, Run]  # rate -> run, for one case on one server start


def recorded(
    records: Sequence[dict[str, Any]], server: str, model: str, case: Case, **more: Any
) -> dict[str, Any] | None:
    """The first of `records` (tuning searches, settlings or capacities) of `server` on `model`
    in `case` whose other fields equal `more`; None where there is none."""
    key = {"server": server, "model": model, "deadline_ms": case[0], "arrival": case[1], **more}
    return next((r for r in records if all(r.get(k) == v for k, v in key.items())), None)


def write_json(path: Path, doc: Mapping[str, Any]) -> None:
    """`doc` written to `path` whole or not at all (a new file renamed over it)."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(doc, indent=1, default=str))
    part.replace(path)


def machine_text() -> str:
    """This machine as a run's JSON names it: architecture, cores, platform."""
    return f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}"


def tuning_rank(record: Mapping[str, Any]) -> tuple[float, float]:
    """A tuning search's place in `best_knobs`'s order: its capacity (0 for a knob screened
    out, which has none: below every one searched), then its on-time ratio at its first failure."""
    return record["capacity_rps"] or 0.0, record["on_time_at_first_failure"] or 0.0


def screening_bar(records: Iterable[Mapping[str, Any]]) -> tuple[float, float | None] | None:
    """Where one server's next knob is screened in one case, from its tuning `records` there:
    the best one's capacity (the bar; best as `best_knobs` ranks them), and the lowest rate above
    it at which that best was not on time (None where it never failed); None where none has a
    capacity yet."""
    searched = [r for r in records if r["capacity_rps"]]
    if not searched:
        return None
    best = max(searched, key=tuning_rank)
    bar = float(best["capacity_rps"])
    fails = [
        float(rate)
        for rate, s in best["runs"].items()
        if float(rate) > bar and (s["on_time_ratio"] or 0.0) < THRESHOLD
    ]
    return bar, min(fails, default=None)


def checkpoint_path(out: Path) -> Path:
    """Where the full benchmark keeps what it has measured until it writes `out`."""
    return out.with_suffix(".partial.json")


class Bench:
    """The full benchmark, and the server handling every mode shares. With a `checkpoint`
    path, everything measured is written there as soon as it is measured (`save`): each tuning
    search, settling, capacity and compute bound. A run `resume`d from that file measures only
    what it lacks."""

    def __init__(
        self,
        st: Settings,
        frames: list[bytes],
        trace: np.ndarray,
        checkpoint: Path | None = None,
    ) -> None:
        self.st, self.frames, self.trace = st, frames, trace
        self.checkpoint = checkpoint
        self.results: list[dict[str, Any]] = []
        self.tuning: list[dict[str, Any]] = []
        self.settled: list[dict[str, Any]] = []
        self.bounds: dict[str, dict[str, Any]] = {}
        self.checks: dict[str, dict[str, Any]] = {}
        self.finals: list[dict[str, Any]] = []  # each case's final rounds (bench/peers_final.py)
        # (server, model, deadline, arrival) -> its pick, the best capacity its tuning found
        # there (any knob's), and whether it was tuned over more than one knob
        self.picks: dict[tuple[str, str, float, str], tuple[Knobs, float, bool]] = {}
        self.t0_s = time.monotonic()
        self.elapsed_before_s = 0.0  # a resumed run's time before this one

    def resume(self, doc: Mapping[str, Any], name: str) -> None:
        """Take up what the saved run `doc` (read from `name`) measured. Raises ValueError naming
        the first setting in which this run differs from it: a resumed run measures the rest
        the same way."""
        before, now = doc.get("settings", {}), self.st.record()
        for key in sorted(now.keys() | before.keys()):
            if before.get(key) != now.get(key):
                raise ValueError(
                    f"{name} was measured with {key} = {before.get(key)!r}, this run has "
                    f"{now.get(key)!r}: give the flags it was started with"
                )
        self.results, self.tuning = list(doc["results"]), list(doc["tuning"])
        self.settled, self.bounds = list(doc["settled"]), dict(doc["compute_bound"])
        self.checks, self.finals = dict(doc["checks"]), list(doc["finals"])
        self.elapsed_before_s = float(doc.get("elapsed_s", 0.0))

    def document(self) -> dict[str, Any]:
        """Everything measured so far, with the settings, date and machine."""
        return {
            "date": dt.date.today().isoformat(),
            "machine": machine_text(),
            "elapsed_s": round(self.elapsed_s()),
            "settings": self.st.record(),
            "compute_bound": self.bounds,
            "checks": self.checks,
            "results": self.results,
            "tuning": self.tuning,
            "settled": self.settled,
            "finals": self.finals,
        }

    def elapsed_s(self) -> float:
        """Seconds this run has measured for, a resumed run's earlier time included."""
        return self.elapsed_before_s + time.monotonic() - self.t0_s

    def progress(self, model: str, part: str) -> str:
        """Where the run stands, for a progress line: "(PART, model i of n; H h M min so far)"."""
        hours, rest_s = divmod(self.elapsed_s(), 3600)
        return (
            f"({part}, model {self.st.models.index(model) + 1} of {len(self.st.models)}; "
            f"{int(hours)} h {int(rest_s // 60)} min so far)"
        )

    def save(self) -> None:
        """`document()` written to the checkpoint (`write_json`), where there is one."""
        if self.checkpoint is not None:
            write_json(self.checkpoint, self.document())

    def arrivals(
        self, arrival: str, rate: float, tuning: bool, seed: int
    ) -> tuple[np.ndarray, float]:
        """One run's arrivals (`arrivals_for`) and its duration in seconds: Poisson's for at
        least the set duration and `min_requests` requests, the trace's `min_requests`."""
        d = self.st.tune_duration_s if tuning else self.st.duration_s
        dur = max(d, self.st.min_requests / rate)
        arr = arrivals_for(arrival, rate, dur, seed, self.trace, self.st.min_requests)
        if arrival != "poisson" and len(arr):
            dur = float(arr[-1])
        return arr, dur

    async def measure(
        self, load: Load, cache: Cache, arrival: str, rate: float, tuning: bool
    ) -> Run:
        """`load`'s run at `rate`, measured once per case and server start (`cache`, the
        runs of one case: a deadline and an arrival process). A server found dead
        is started again first (`revive`); one that dies during the run is measured again once,
        and where it dies again the run is kept, with its exit status, as what it served."""
        if rate not in cache:
            arr, dur = self.arrivals(arrival, rate, tuning, self.st.seed)
            for again in (False, True):
                await self.revive(load, rate)
                samples = await load.run_arrivals(arr, load.deadline_ms / 1000.0)
                exited = load.run.proc.poll()
                if exited is None or again:
                    break
                print(
                    f"    {load.run.server} exited ({exited}) during its run at {rate:g} req/s; "
                    "measuring that rate again",
                    flush=True,
                )
            cache[rate] = Run(samples, dur, exited)
            if exited is None:
                await load.quiesce()
        return cache[rate]

    async def search(
        self,
        load: Load,
        cache: Cache,
        arrival: str,
        deadline: float,
        start: float,
        tol: float,
        tuning: bool,
        known: Sequence[tuple[float, bool]] = (),
        floor: float | None = None,
        then: float | None = None,
    ) -> RateSearch:
        """`load`'s capacity in one case (`RateSearch` from `start`, given what is `known`,
        with its `floor` and `then`), each rate measured once (`measure`)."""
        rs = RateSearch(start, tol, floor=floor, then=then)
        for rate, ok in known:
            rs.record(rate, ok)
        while (r := rs.next_rate()) is not None:
            s = (await self.measure(load, cache, arrival, r, tuning)).summary(deadline)
            rs.record(r, (s["on_time_ratio"] or 0.0) >= THRESHOLD)
            print(
                f"    {load.run.server:<10} {load.run.knobs.label:<13} {arrival:<7} "
                f"{deadline:>5g}ms {r:>6.1f} req/s  on-time {s['on_time_ratio']:.3f}  "
                f"mean {s['mean_ms'] or 0:>6.1f}  p99 {s['p99_ms'] or 0:>6.1f}  "
                f"(n={s['requests']}, timeouts {s['timeouts']}, errors {s['errors']}, "
                f"dropped {s['dropped']})"
                + (f" SERVER EXITED ({s['server_exited']})" if "server_exited" in s else ""),
                flush=True,
            )
        return rs

    @staticmethod
    def runs_table(cache: Cache, deadline: float) -> dict[str, dict[str, Any]]:
        """One case's runs as a result records them: each rate's summary, by rate."""
        return {f"{rate:g}": cache[rate].summary(deadline) for rate in sorted(cache)}

    def spawn(self, server: str, model: str, knobs: Knobs, deadline: float) -> Running:
        """`server`'s process, started with this run's settings (not yet answering)."""
        return Running(
            server, model, knobs, deadline, self.st.logdir, self.st.policy, self.st.fold_peers,
            self.st.step_log,
        )  # fmt: skip

    async def start(
        self, server: str, model: str, knobs: Knobs, deadline: float, tries: int = 2
    ) -> Load:
        """`server` up and answering (`until_ready`)."""
        load = Load(self.spawn(server, model, knobs, deadline), self.frames, deadline)
        await self.until_ready(load, tries)
        return load

    async def until_ready(self, load: Load, tries: int = 2) -> None:
        """Until `load`'s server answers; one that exits while starting is started again, up to
        `tries` times in all (Triton's Python backend sometimes fails its handshake when another
        server is starting beside it). The load is closed where it never comes up."""
        for attempt in range(1, tries + 1):
            run = load.run
            try:
                await load.ready()
                break
            except BaseException as e:
                await asyncio.to_thread(run.stop)
                if not isinstance(e, ExitedEarly) or attempt == tries:
                    await load.close()
                    raise
                print(
                    f"  {run.server} exited ({run.proc.returncode}) while starting "
                    f"(log: {run.log}); starting it again",
                    flush=True,
                )
                load.run = self.spawn(run.server, run.model, run.knobs, run.deadline_ms)
        print(
            f"  {run.server} {run.model} {run.knobs.label}: ready in {run.ready_s:.0f} s, idle "
            f"{load.idle_ms:.1f} ms, top-1 of frame 0 = {load.top1}",
            flush=True,
        )
        self.checks.setdefault(run.model, {})[run.server] = {
            "top1_frame0": load.top1,
            "idle_ms": round(load.idle_ms or 0, 2),
            "ready_s": round(run.ready_s or 0, 1),
            "starts": attempt,
        }

    async def stop(self, load: Load) -> None:
        await load.close()
        await asyncio.to_thread(load.run.stop)

    async def warm(self, loads: Iterable[Load], rate: float, deadline_ms: float) -> None:
        """Each server serves WARM_LOAD_S of Poisson arrivals at `rate`, not measured: its first
        batches under load (kernels for new batch sizes, a JIT) must not count against a rate."""
        for load in loads:
            arr = poisson_arrivals_s(rate, WARM_LOAD_S, np.random.default_rng([self.st.seed, 99]))
            await load.run_arrivals(arr, deadline_ms / 1000.0)
            await load.quiesce()

    async def alone(
        self,
        load: Load,
        others: Mapping[str, Load],
        arrivals_s: np.ndarray,
        duration_s: float,
        deadline_ms: float,
    ) -> dict[str, Any]:
        """`measure_alone`, the others stopped when `st.pause_idle`; the summary says
        "server_exited" (its exit status) when the server died during it."""
        s = await measure_alone(
            load, others, arrivals_s, duration_s, deadline_ms, self.st.pause_idle
        )
        if load.run.proc.poll() is not None:
            s["server_exited"] = load.run.proc.returncode
        return s

    async def revive(self, load: Load, rate: float) -> bool:
        """Whether `load`'s server had exited and was started again, with the same knobs and
        deadline, in place (`load.run` is the new process), warmed up at `rate` and the exit said
        on stdout. (Triton's Python backend crashed once under load in over a hundred runs, a
        segfault on its shared-memory lock; the runs after it had measured a dead server as 0 on
        time, saying nothing.)"""
        run = load.run
        if run.proc.poll() is None:
            return False
        print(
            f"  {run.server} exited ({run.proc.returncode}) while serving (log: {run.log}); "
            "starting it again",
            flush=True,
        )
        await asyncio.to_thread(run.stop)
        load.run = self.spawn(run.server, run.model, run.knobs, run.deadline_ms)
        await self.until_ready(load)
        await self.warm([load], rate, load.deadline_ms)
        return True

    async def settle(
        self,
        server: str,
        model: str,
        case: tuple[float, str],
        caps: dict[Knobs, tuple[float, float]],
        start_deadline_ms: float,
    ) -> Knobs:
        """The tuning's pick for `case` (deadline, arrivals) or its runner-up, whichever serves
        more on time in `st.settle_pairs` pairs on the same arrivals at the pick's capacity,
        both up at once and each measured alone (`alone`), in alternating order. One capacity
        search each is noisy: layerbatch's 2 replicas lost to one runtime in tuning on both
        1000 ms trace cells and beat it in every later pair (bench/results/peers-log.md,
        session 48). Each settling is kept in `self.settled`."""
        on_record = recorded(self.settled, server, model, case)
        if on_record is not None:
            print(f"  {server} {model} {case[0]:g} ms {case[1]}: {on_record['knobs']} in pairs, "
                  "on record", flush=True)  # fmt: skip
            return knobs_from_label(on_record["knobs"])
        pick, other = best_knobs(caps), runner_up(caps)
        if other is None or self.st.settle_pairs < 1:
            return pick
        deadline_ms, arrival = case
        rate = caps[pick][0]
        loads: dict[Knobs, Load] = {}
        on_time: dict[Knobs, list[float]] = {pick: [], other: []}
        try:
            for k in (pick, other):
                loads[k] = await self.start(server, model, k, start_deadline_ms)
                loads[k].set_deadline(deadline_ms)
            await self.warm(loads.values(), rate, deadline_ms)
            for i in range(self.st.settle_pairs):
                arr, dur = self.arrivals(arrival, rate, True, self.st.seed + i)
                for k in (pick, other) if i % 2 == 0 else (other, pick):
                    await self.revive(loads[k], rate)
                    beside = {o.label: load for o, load in loads.items() if o != k}
                    s = await self.alone(loads[k], beside, arr, dur, deadline_ms)
                    on_time[k].append(s["on_time_ratio"] or 0.0)
                    print(
                        f"    {server:<10} {k.label:<13} pair {i} at {rate:g} req/s: on-time "
                        f"{on_time[k][-1]:.3f}",
                        flush=True,
                    )
        finally:
            for load in loads.values():
                await self.stop(load)
        chosen = settled(pick, other, on_time)
        print(
            f"  {server} {model} {deadline_ms:g} ms {arrival}: {chosen.label} in pairs "
            f"({pick.label} {np.mean(on_time[pick]):.3f}, {other.label} "
            f"{np.mean(on_time[other]):.3f} on time at {rate:g} req/s)",
            flush=True,
        )
        self.settled.append(
            {
                "server": server,
                "model": model,
                "deadline_ms": deadline_ms,
                "arrival": arrival,
                "rate_rps": rate,
                "on_time": {k.label: v for k, v in on_time.items()},
                "tuning_pick": pick.label,
                "knobs": chosen.label,
            }
        )
        self.save()
        return chosen

    async def server_model(self, server: str, model: str, bound: float) -> None:
        """Tune (peers), then pick the best knobs per deadline, for each arrival process, and
        with `st.final_rounds` keep each pick in `self.picks` for the final rounds (`model`),
        else search its capacity here (`final`). A peer is tuned under each arrival process it
        is measured under: knobs best for Poisson arrivals need not be best for the bursty
        trace (TorchServe's were not). A server with one knob is tuned only for the final
        rounds, whose rates start from the tuned capacities. What is on record (a resumed run)
        is taken from there; a server is started only for the rest."""
        st = self.st
        # a server that is given the deadline at start (Triton's queue policy) runs per deadline;
        # layerbatch takes it per request, the others ignore it: one start serves every deadline
        groups = [[d] for d in st.deadlines] if server == "triton" else [st.deadlines]
        for group in groups:
            cases = [(d, a) for d in group for a in st.arrivals]
            grid = self.grid_order(server, model, cases)
            tuned: dict[Case, dict[Knobs, dict[str, Any]]] = {c: {} for c in cases}
            if len(grid) > 1 or st.final_rounds:
                for knobs in grid:
                    await self.tune(server, model, knobs, cases, group[0], bound, tuned)
            best = {}
            for c in cases:
                caps = {k: tuning_rank(r) for k, r in tuned[c].items()}
                best[c] = await self.settle(server, model, c, caps, group[0]) if caps else grid[0]
                if st.final_rounds:
                    # the settling's rate: a runner-up that won there may have tuned lower
                    tuned_rps = max((rank[0] for rank in caps.values()), default=0.0)
                    self.picks[(server, model, *c)] = (best[c], tuned_rps, len(grid) > 1)
            if st.final_rounds:
                continue
            for knobs in dict.fromkeys(best.values()):
                mine = [c for c in cases if best[c] == knobs]
                await self.final(server, model, knobs, mine, group[0], bound, tuned)

    def grid_order(self, server: str, model: str, cases: Sequence[Case]) -> list[Knobs]:
        """`server`'s grid in the order its knobs are tuned in `cases`: first those that were
        its best in them in the tuning runs on record beside `st.out` (`knobs_on_record`), then
        the rest in grid order. Only the time differs: the first knob's search is the only one
        not screened, and the better the first knobs the fewer are searched past their screen."""
        grid = layerbatch_grid(self.st) if server == "layerbatch" else self.st.grid
        found = [
            knobs_on_record(self.st.out, model, d, a, self.st.min_requests).get(server)
            for d, a in cases
        ]
        lead = [k for k in dict.fromkeys(f[0] for f in found if f) if k in grid]
        if lead:
            print(f"  {server} {model}: tried first, best on record: "
                  f"{', '.join(k.label for k in lead)}", flush=True)  # fmt: skip
        return lead + [k for k in grid if k not in lead]

    async def tune(
        self,
        server: str,
        model: str,
        knobs: Knobs,
        cases: Sequence[Case],
        start_deadline_ms: float,
        bound: float,
        tuned: dict[Case, dict[Knobs, dict[str, Any]]],
    ) -> None:
        """`knobs`' capacity search in each of `cases`, at the tuning's tolerance, each kept in
        `self.tuning` and in `tuned` (by case and knobs) and saved; a case on record is taken
        from there. With `st.screen`, where another of this server's knobs has a capacity in
        the case, the search is screened (`screening_bar`): it starts at the best capacity so
        far (the bar) and ends if not on time there (these knobs cannot be the best: recorded
        with no capacity, "below_rps" the bar, and their on-time ratio there); else it goes on
        at the rate where the best first failed, and ends if not on time there too (a tie,
        decided as any is, by the on-time ratio at that rate), else searches on from it."""
        todo = []
        for c in cases:
            on_record = recorded(self.tuning, server, model, c, knobs=asdict(knobs))
            if on_record is None:
                todo.append(c)
            else:
                tuned[c][knobs] = on_record
        if not todo:
            print(f"  {server} {model} {knobs.label}: tuning on record", flush=True)
            return
        load = await self.start(server, model, knobs, start_deadline_ms)
        try:
            for d, arrival in todo:
                load.set_deadline(d)
                cache: Cache = {}
                screen = screening_bar(tuned[(d, arrival)].values()) if self.st.screen else None
                bar, then = screen or (None, None)
                start = bar or self._start_rate(model, d, arrival, bound)
                rs = await self.search(
                    load, cache, arrival, d, start, self.st.tune_tol, True, floor=bar, then=then
                )
                fails = [r for r, ok in rs.tried if not ok]
                near = cache[min(fails)].summary(d)["on_time_ratio"] if fails else 1.0
                record = {
                    "server": server,
                    "model": model,
                    "deadline_ms": d,
                    "arrival": arrival,
                    "knobs": asdict(knobs),
                    "capacity_rps": None if rs.below_floor else rs.capacity,
                    "on_time_at_first_failure": near,
                    "runs": self.runs_table(cache, d),
                }
                if rs.below_floor:
                    record["below_rps"] = bar
                    print(f"    {server} {knobs.label}: screened out, below {bar:g} req/s, "
                          "the best capacity so far", flush=True)  # fmt: skip
                self.tuning.append(record)
                tuned[(d, arrival)][knobs] = record
                self.save()
        finally:
            await self.stop(load)

    async def final(
        self,
        server: str,
        model: str,
        knobs: Knobs,
        cases: Sequence[Case],
        start_deadline_ms: float,
        bound: float,
        tuned: Mapping[Case, Mapping[Knobs, Mapping[str, Any]]],
    ) -> None:
        """The capacity at `knobs` in each of `cases`, at the final tolerance, starting from
        what their tuning search found at these knobs; each kept in `self.results` and saved.
        A case on record is skipped."""
        todo = [c for c in cases if recorded(self.results, server, model, c) is None]
        if not todo:
            print(f"  {server} {model} {knobs.label}: capacities on record", flush=True)
            return
        load = await self.start(server, model, knobs, start_deadline_ms)
        try:
            for d, arrival in todo:
                load.set_deadline(d)
                prior = tuned[(d, arrival)].get(knobs, {}).get("runs", {})
                known = [
                    (float(r), (s["on_time_ratio"] or 0) >= THRESHOLD) for r, s in prior.items()
                ]
                lo = max((r for r, ok in known if ok), default=None)
                hi = min((r for r, ok in known if not ok), default=None)
                seeds = [(r, ok) for r, ok in ((lo, True), (hi, False)) if r]
                start = self._start_rate(model, d, arrival, bound)
                cache: Cache = {}
                rs = await self.search(load, cache, arrival, d, start, self.st.tol, False, seeds)
                self.results.append(
                    {
                        "server": server,
                        "model": model,
                        "deadline_ms": d,
                        "arrival": arrival,
                        "knobs": knobs.label,
                        "tuned_under": arrival if tuned[(d, arrival)] else None,
                        "capacity_rps": rs.capacity,
                        "runs": self.runs_table(cache, d),
                        "tuning_runs_at_these_knobs": dict(prior),
                    }
                )
                self.save()
                print(
                    f"  => {server} {model} {d:g} ms {arrival}: capacity "
                    f"{rs.capacity:g} req/s ({knobs.label})",
                    flush=True,
                )
        finally:
            await self.stop(load)

    def _start_rate(self, model: str, deadline: float, arrival: str, bound: float) -> float:
        """Where a capacity search starts: 0.8 x the best capacity found so far for this model,
        deadline and arrival process (any server, any knobs; with Poisson's for the trace when
        there is none yet), else the compute bound; this saves the runs far from capacity (under
        the Azure trace capacity is about a tenth of the compute bound)."""
        found = [
            float(r["capacity_rps"])
            for r in self.results
            if (r["model"], r["deadline_ms"], r["arrival"]) == (model, deadline, arrival)
        ] + [
            float(t["capacity_rps"])
            for t in self.tuning
            if (t["model"], t["deadline_ms"], t["arrival"]) == (model, deadline, arrival)
            and t["capacity_rps"] is not None  # screened out: only "below" some rate
        ]
        if any(found):
            return 0.8 * max(found)
        if arrival != "poisson":
            return self._start_rate(model, deadline, "poisson", bound)
        return bound

    def compute_bound(self, model: str) -> dict[str, Any]:
        with_frames = self.st.logdir / "frames.npz"
        np.savez(with_frames, *[np.frombuffer(f, dtype=np.uint8) for f in self.frames])
        out = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "peers_model.py"), "--bound", model,
             "--frames", str(with_frames), "--repeats", "2"],
            capture_output=True, text=True, check=True,
            env={**os.environ, "PEERS_TORCH_THREADS": str(THREADS)},
        )  # fmt: skip
        doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        doc["lanes_rps"] = round(samples_per_s(model, THREADS, 1, LANE_BATCH, LANE_SECONDS), 2)
        doc["rps"] = round(compute_bound_rps(doc["decode_ms"], doc["forward_ms"]), 2)
        doc["batched_rps"] = round(batched_ceiling_rps(doc), 2)
        return doc

    async def model(self, model: str) -> None:
        """Every server on `model` (`server_model`), then with `st.final_rounds` each case's
        final rounds at the picks (`final_case`), between two measurements of the compute
        bound; a model on record whole (its bound measured after) is skipped. A model resumed
        halfway has its bound measured again (kept under "resumed"), and a warning where the
        machine's speed differs from when its runs began."""
        on_record = self.bounds.get(model, {})
        if "after" in on_record:
            print(f"[{model}] on record: every server measured", flush=True)
            return
        before: dict[str, Any] | None = on_record.get("before")
        if before is None:
            before = await asyncio.to_thread(self.compute_bound, model)
        print(
            f"[{model}] compute bound: decode {before['decode_ms']:.1f} ms + forward "
            f"{before['forward_ms']:.1f} ms ({before['layout']}) = {before['rps']:.1f} req/s; "
            f"batched ceiling {before['batched_rps']:.1f} req/s"
            + (" (on record)" if on_record else ""),
            flush=True,
        )
        resumed: list[dict[str, Any]] = list(on_record.get("resumed", []))
        if on_record:
            resumed.append(await asyncio.to_thread(self.compute_bound, model))
            warning = speed_warning(mean_bound(before, resumed[-1]))
            if warning:
                print(f"[{model}] resumed: {warning}", flush=True)
        kept = {"resumed": resumed} if resumed else {}
        self.bounds[model] = {"before": before, **kept}
        self.save()
        for i, server in enumerate(self.st.servers, 1):
            part = f"server {i} of {len(self.st.servers)}"
            print(f"[{model}] {server} {self.progress(model, part)}", flush=True)
            await self.server_model(server, model, before["rps"])
        if self.st.final_rounds:
            cases = [(d, a) for d in self.st.deadlines for a in self.st.arrivals]
            for i, case in enumerate(cases, 1):
                picks = {s: self.picks[(s, model, *case)] for s in self.st.servers}
                part = f"case {i} of {len(cases)}"
                await final_case(self, model, case, picks, self.progress(model, part))
        after = await asyncio.to_thread(self.compute_bound, model)
        self.bounds[model] = {**mean_bound(before, after), **kept}
        self.save()
        print(
            f"[{model}] compute bound after: {after['rps']:.1f} req/s "
            f"(mean {self.bounds[model]['rps']:.1f}), batched ceiling {after['batched_rps']:.1f}",
            flush=True,
        )
        warning = speed_warning(self.bounds[model])
        if warning:
            print(f"[{model}] {warning}", flush=True)

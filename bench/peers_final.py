"""The full benchmark's capacities from interleaved rounds (bench/peers.py, `--final-rounds`),
and the rounds every interleaved measurement runs (`measure_rounds`, shared with --interleave).

Once each server's knobs are tuned on a model, each case (a deadline and an arrival process) is
measured as an --interleave run measures a cell: every server up at once with its pick, each
rate measured for each server in turn on the same arrivals (the order alternating by round),
the others stopped meanwhile, `--final-rounds` times. The rates span the tuned capacities
(`final_rates`: from FINAL_SPAN[0] x the lowest to FINAL_SPAN[1] x the highest); a server whose
mean on-time ratio does not cross the threshold between its rates is measured further out, in
growing steps, up to MAX_EXTENSIONS times (the machine's speed can move 2x between the tuning
and the rounds), and one whose crossing lies between two rates more than FINAL_STEP apart is
measured between them, up to MAX_REFINES times (`next_rate`). A server's capacity is where its
mean on-time ratio over the rounds crosses the threshold (bench/peers_crossing.py), and
layerbatch / best peer comes with its bootstrap interval over the rounds.

Why not each server's capacity searched alone, one after another: on a shared machine the speed
drifts (the batched ceiling moved from 31 to 17 req/s within one run, session 61), so servers
searched in turn are compared at different speeds; in rounds the drift hits all alike. The
README's table has been measured this way since session 40.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.peers_busy import busy_line
from bench.peers_capacity import RateSearch
from bench.peers_crossing import RatioInterval, edge_crossing, ratio_interval, threshold_crossing
from bench.peers_knobs import Knobs, knobs_from_label
from bench.peers_report import mean_on_time, rounds_of

if TYPE_CHECKING:
    from bench.peers_load import Load
    from bench.peers_tuning import Bench

# the rates span from this much below the lowest tuned capacity to this much above the highest
FINAL_SPAN = (0.85, 1.15)
FINAL_STEP = 1.12  # at most this ratio between neighbouring rates, where 6 rates cover the span
FINAL_COUNT = (4, 6)  # rates measured: at least, at most
EXTEND_BY = 1.2  # the k-th rate beyond a server's edge is EXTEND_BY**k further out than the last
MAX_EXTENSIONS = 3  # rates beyond the span per server: up to 3x past it, 1.2 x 1.44 x 1.73
MAX_REFINES = 2  # rates added between two that bracket a server's crossing

Runs = dict[str, dict[str, list[dict[str, Any]]]]  # server -> rate ("{rate:g}") -> round summaries
WHY = {
    "beyond": "no crossing of the threshold between its rates",
    "between": "its crossing lies between two rates far apart",
}


def final_rates(capacities: Iterable[float]) -> list[float]:
    """The rates a case's rounds measure: geometrically spaced from FINAL_SPAN[0] x the lowest
    positive capacity to FINAL_SPAN[1] x the highest, FINAL_STEP apart or closer where
    FINAL_COUNT[1] rates cover that, at least FINAL_COUNT[0], ascending, to three significant
    digits (`rate_3g`). Raises ValueError when no capacity is positive."""
    caps = [float(c) for c in capacities if c and c > 0]
    if not caps:
        raise ValueError("capacities: expected at least one above 0 req/s to place the rates")
    lo, hi = FINAL_SPAN[0] * min(caps), FINAL_SPAN[1] * max(caps)
    steps = math.ceil(math.log(hi / lo) / math.log(FINAL_STEP))
    count = min(FINAL_COUNT[1], max(FINAL_COUNT[0], steps + 1))
    return sorted({rate_3g(r) for r in np.geomspace(lo, hi, count)})


def rate_3g(rate: float) -> float:
    """A rate to three significant digits: 0.1 req/s would merge the rates of a search that
    found nothing on time (0.43-0.58 req/s), and finer digits only clutter the keys."""
    return float(f"{rate:.3g}")


def next_rate(
    on_time: Mapping[float, float], added: Sequence[str] = ()
) -> tuple[float, str] | None:
    """Where a server with mean on-time ratios `on_time` (by rate) is measured next, and why,
    given why each rate was `added` to its span before ("beyond" or "between"). Where it does
    not cross the threshold between its rates (`edge_crossing`), "beyond": EXTEND_BY**k above
    its highest rate when it never fell under it, that much below its lowest when it was under
    it there already, in its k-th such rate, up to MAX_EXTENSIONS. Where it crosses between two
    rates more than FINAL_STEP apart, "between": their geometric mean, up to MAX_REFINES. Rates
    as `rate_3g`; None when neither applies."""
    capacity, _ = threshold_crossing(on_time)
    _, side = edge_crossing(on_time)
    rates, beyond = sorted(on_time), added.count("beyond")
    if side and beyond < MAX_EXTENSIONS:
        factor = EXTEND_BY ** (beyond + 1)
        return rate_3g(rates[-1] * factor if side == "above" else rates[0] / factor), "beyond"
    if side or added.count("between") >= MAX_REFINES:
        return None
    above = min(r for r in rates if r > capacity)
    if above / capacity <= FINAL_STEP * 1.01:  # 1.01: rates are rounded
        return None
    return rate_3g(math.sqrt(capacity * above)), "between"


def round_line(s: Mapping[str, Any]) -> str:
    """One measured round as it is printed; errors and a server that died are said."""
    return (
        f"on-time {s['on_time_ratio']:.3f} mean {s['mean_ms'] or 0:6.1f} "
        f"p99 {s['p99_ms'] or 0:6.1f} dropped {s['dropped']} timeouts {s['timeouts']} "
        + (f"errors {s['errors']} " if s.get("errors") else "")
        + (f"SERVER EXITED ({s['server_exited']}) " if "server_exited" in s else "")
        + f"others' CPU {sum(s['others_cpu_s'].values()):.1f} s "
        f"client {s['client_cpu_share']:.0%} of a core"
        + (f"; {busy_line(s['busy_share'])}" if "busy_share" in s else "")
    )


async def measure_rounds(
    bench: Bench,
    loads: Mapping[str, Load],
    rates: Mapping[str, Iterable[float]],
    arrival: str,
    deadline_ms: float,
    rounds: int,
    runs: Runs,
    restarts: dict[str, list[dict[str, Any]]],
) -> None:
    """Each server of `loads` at each of its `rates`, `rounds` times: per round, per rate
    (ascending), the servers in turn (in `loads`' order in even rounds, reversed in odd ones),
    each alone (`Bench.alone`) on the same arrivals (Poisson's drawn anew each round, with the
    seed plus the round; the trace's the same each round). Each summary is appended to `runs`
    as it is measured, and the bench saved; a run `runs` holds already (a resumed case) is not
    measured again. A server found dead first is started again (`Bench.revive`), recorded in
    `restarts`."""
    wanted = {s: set(rates[s]) for s in loads}
    for rnd in range(rounds):
        for rate in sorted(set().union(*wanted.values())):
            order = list(loads) if rnd % 2 == 0 else list(loads)[::-1]
            for server in (s for s in order if rate in wanted[s]):
                done = runs.setdefault(server, {}).setdefault(f"{rate:g}", [])
                if len(done) > rnd:
                    continue
                if await bench.revive(loads[server], rate):
                    restarts.setdefault(server, []).append({"round": rnd, "rps": rate})
                arr, dur = bench.arrivals(arrival, rate, False, bench.st.seed + rnd)
                others = {n: x for n, x in loads.items() if n != server}
                s = await bench.alone(loads[server], others, arr, dur, deadline_ms)
                done.append(s)
                bench.save()
                print(f"  round {rnd} {rate:>5.1f} req/s {server:<11} {round_line(s)}", flush=True)


def new_record(
    model: str,
    case: tuple[float, str],
    picks: Mapping[str, tuple[Knobs, float, bool]],
    rounds: int,
) -> dict[str, Any]:
    """A case's final rounds before any is measured: each server's pick (its knobs, the best
    capacity its tuning found, whether it was tuned over more than one knob) and the rates
    (`final_rates`)."""
    return {
        "model": model,
        "deadline_ms": case[0],
        "arrival": case[1],
        "knobs": {s: k.label for s, (k, _, _) in picks.items()},
        "tuned_rps": {s: c for s, (_, c, _) in picks.items()},
        "tuned_under": {s: case[1] if tuned else None for s, (_, _, tuned) in picks.items()},
        # no server on time even at the search's lowest rate: the rates start from that one
        "rates": final_rates([c for _, c, _ in picks.values() if c > 0] or [RateSearch.min_rate]),
        "rounds": rounds,
        "added": {},
        "runs": {},
        "restarts": {},
        "complete": False,
    }


async def final_case(
    bench: Bench,
    model: str,
    case: tuple[float, str],
    picks: Mapping[str, tuple[Knobs, float, bool]],
    progress: str = "",
) -> dict[str, Any]:
    """`model`'s final rounds in `case` (module docstring), kept in `bench.finals` and saved
    after every run; a case on record whole is taken from there, one on record in part is
    measured on from where it stopped, at the knobs and rates on record. When the case is
    complete, each server's result (`final_results`) is added to `bench.results`. `progress`
    ends the line that starts the rounds (`Bench.progress`)."""
    deadline_ms, arrival = case
    record = case_record(bench.finals, model, case)
    if record is not None and record["complete"]:
        print(f"[{model}] {deadline_ms:g} ms {arrival}: final rounds on record", flush=True)
        return record
    if record is None:
        record = new_record(model, case, picks, bench.st.final_rounds)
        bench.finals.append(record)
        bench.save()
    base = [float(r) for r in record["rates"]]
    added: dict[str, list[dict[str, Any]]] = record["added"]  # server -> rates added, and why
    wanted = {s: set(base) | {a["rps"] for a in added.get(s, [])} for s in record["knobs"]}
    print(
        f"[{model}] {deadline_ms:g} ms {arrival}: final rounds at "
        f"{', '.join(f'{r:g}' for r in base)} req/s, {record['rounds']} rounds; "
        + ", ".join(f"{s} {k}" for s, k in record["knobs"].items())
        + (f" {progress}" if progress else ""),
        flush=True,
    )
    loads: dict[str, Load] = {}
    try:
        for server, label in record["knobs"].items():
            loads[server] = await bench.start(server, model, knobs_from_label(label), deadline_ms)
        await bench.warm(loads.values(), base[0], deadline_ms)
        while True:
            await measure_rounds(
                bench, loads, wanted, arrival, deadline_ms, record["rounds"], record["runs"],
                record["restarts"],
            )  # fmt: skip
            further = {}
            for server, per in mean_on_time({s: record["runs"][s] for s in loads}).items():
                reasons = [a["why"] for a in added.get(server, [])]
                found = next_rate({float(r): v for r, v in per.items()}, reasons)
                if found is not None and found[0] not in wanted[server]:
                    further[server] = found
            if not further:
                break
            for server, (rate, why) in further.items():
                print(f"  {server}: {WHY[why]}; measured at {rate:g} req/s too", flush=True)
                added.setdefault(server, []).append({"rps": rate, "why": why})
                wanted[server].add(rate)
            bench.save()
    finally:
        for load in loads.values():
            await bench.stop(load)
    record["complete"] = True
    bench.results.extend(final_results(record))
    bench.save()
    return record


def mean_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One rate's rounds as a result's run: the means of the on-time ratio and of the mean and
    p99 latencies (ms; over the rounds that answered any), the counts summed, the rounds kept."""

    def mean(key: str) -> float | None:
        values = [x[key] for x in rounds if x.get(key) is not None]
        return round(float(np.mean(values)), 4) if values else None

    counts = ("requests", "timeouts", "dropped", "errors")
    return {
        "on_time_ratio": mean("on_time_ratio"),
        "mean_ms": mean("mean_ms"),
        "p99_ms": mean("p99_ms"),
        **{k: sum(int(x.get(k) or 0) for x in rounds) for k in counts},
        "rounds": rounds,
    }


def final_results(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A complete case's results, one per server, as the table and plot read them: its knobs,
    each rate's rounds (`mean_summary`), and as `capacity_rps` and `crossing_rps` the two of
    `threshold_crossing` over the rounds' mean on-time ratios."""
    out = []
    for server, per in mean_on_time(record["runs"]).items():
        capacity, crossing = threshold_crossing({float(r): v for r, v in per.items()})
        out.append(
            {
                "server": server,
                "model": record["model"],
                "deadline_ms": record["deadline_ms"],
                "arrival": record["arrival"],
                "knobs": record["knobs"][server],
                "tuned_under": record["tuned_under"][server],
                "capacity_rps": capacity,
                "crossing_rps": crossing,
                "final": f"{record['rounds']} rounds interleaved",
                "runs": {
                    r: mean_summary(v)
                    for r, v in sorted(record["runs"][server].items(), key=lambda x: float(x[0]))
                },
            }
        )
    return out


def final_interval(
    finals: Iterable[dict[str, Any]], row: Mapping[str, Any], rng: np.random.Generator
) -> RatioInterval | None:
    """layerbatch / best peer in a table row's case with its interval over the rounds
    (`ratio_interval`), from its complete final rounds in `finals`; None without them."""
    record = case_record(finals, row["model"], (row["deadline_ms"], row["arrival"]))
    if record is None or not record["complete"]:
        return None
    return ratio_interval(rounds_of(record), rng)


def case_record(
    finals: Iterable[dict[str, Any]], model: str, case: tuple[float, str]
) -> dict[str, Any] | None:
    """The final rounds of `model` in `case` (deadline, arrival process) in `finals`; None
    where there are none."""
    key = (model, *case)
    return next((r for r in finals if (r["model"], r["deadline_ms"], r["arrival"]) == key), None)

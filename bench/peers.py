"""layerbatch against the servers users would pick instead (issue 9): NVIDIA Triton (PyTriton, its
dynamic batcher), Ray Serve (`@serve.batch`) and TorchServe (its batching), measured in one run
on this machine.

Every server serves one model at a time (resnet18, mobilenet_v2, googlenet; the torchvision
definition under layerexec's seed, so the same weights) with 2 torch threads in all, either one
worker with 2 intra-op threads or two workers of one (TorchServe's workers, Triton's model
instances, Ray Serve's replicas: a knob tuned with the batching knobs; layerbatch's `--replicas`
is tuned the same way, one runtime of 2 threads or two of one, `--layerbatch-replicas`), decodes
and resizes the same JPEG frames server-side with the same code (bench/peers_model.py calls
layerexec's own `rgb_tensor` after the same `cv2.imdecode`), and runs the model channels-last
under inference mode as layerbatch's executor does. One load generator (this file) sends the same
open-loop arrivals to every server, each in its own protocol: layerbatch's msgpack /v1/infer (with
the deadline), Triton's KServe v2 HTTP (the JPEG as a BYTES tensor in the binary extension), Ray
Serve's HTTP route and TorchServe's /predictions (the JPEG as the body). A request is timed from
the moment it was due to be sent to its answer, and is on time when answered OK within the
deadline; the client gives up on a request at its deadline (as a camera would: a late frame is
worthless), which lets a server that cancels abandoned requests (layerbatch, Ray Serve) shed them.

For each server, model, deadline (300 and 1000 ms) and arrival process (Poisson; the Azure LLM code
trace's first --min-requests arrivals rescaled to the rate), the capacity is the highest rate whose
on-time ratio is >= 0.9, found by a search on the rate (grow/shrink by 1.5x from 0.8x the best
capacity found so far, else from the compute bound, then bisection to a tolerance). Each peer's
knobs are tuned over a stated grid (workers x max batch x max delay; the best by capacity, then by
on-time ratio at the rate above it; then that best and the second best serve the same arrivals
at the best's capacity in --settle-pairs pairs, and the one with more on time is kept: one search
each is noisy), at each deadline under each arrival process, and its best there is the one
reported; Triton also rejects a request that has queued longer than the deadline
(its queue policy), and Ray Serve takes up to 256 requests at once per replica
(`max_ongoing_requests`), both of which only help them. A server that dies in a search's run
(Triton's Python backend segfaulted once under load in over a hundred runs) is said, started again
with the same knobs, warmed up, and measured at that rate again; where it dies again, that run is
its result there, marked "server_exited". Settling pairs and --interleave rounds also start a
dead server again before measuring it. layerbatch runs its defaults: dp-tardy,
batch norms folded into the convolutions at load (`layerbatch serve --no-fold-bn` turns it off;
`--fold-peers` hands the peers the same folded model, to see how much of the difference that is),
and each replica decoding its inputs on a thread of its own (the peers decode inside their batch
handlers, in turn with the forward). With `--layerbatch-replicas 1` it runs as one runtime whose 2
torch threads take both cores, and decodes on its executor thread between steps.

The compute bound is the highest rate a plain batch-1 decode + forward can sustain on 2 threads:
1000 / (decode_ms + forward_ms), medians over the frames, the faster memory layout; it is measured
before and after each model's servers (the machine is shared: both are reported, the mean used).
Beside it the batched ceiling: the same with full batches of 8 or 16, 1000 B / (B decode_ms +
forward_ms(B)), the best of those and of the model with its batch norms folded (as layerbatch
runs it): about the most any server could serve here, batching per model or per layer, with
the cores to itself (larger batches gain little more). Under the trace the rate is a mean and
the bursts run far above it, so each report also gives the crossing of an ideal server at the
ceiling under the run's own arrivals (bench/peers_ideal.py: each request 1 / ceiling s, in
arrival order, turning away what it cannot finish in time), and for each server the ceiling at
which that ideal server would cross where the server did: how much of the machine it turns into
requests on time. Where 1.3x the best peer is above the ideal server's crossing, that target is
out of reach on this machine.

Runs in the peers' venv (`make bench-peers` creates .venv-peers and runs the full benchmark):

    .venv-peers/bin/python bench/peers.py --quick     # resnet18, 300 ms, short runs, 2x2x2 grid
    .venv-peers/bin/python bench/peers.py             # full: 3 models x {300, 1000} ms, 2x4x3 grid
    .venv-peers/bin/python bench/peers.py --servers layerbatch,triton --models mobilenet_v2
    .venv-peers/bin/python bench/peers.py --interleave 26,30,34,38 --rounds 2 [--fold-peers]
    .venv-peers/bin/python bench/peers.py --quick --models mobilenet_v2 --arrivals azure \
        --out bench/results/peers-quick-mobilenet_v2-azure.json   # tune under the trace

An --interleave run takes each peer's knobs from the tuning runs on record (peers.json,
peers-quick*.json): those tuned under its arrival process (the first of --arrivals) at its
deadline if any, else the nearest (another deadline, then Poisson arrivals), and says which.
While one server is measured, the others are stopped (SIGSTOP; --no-pause-idle leaves them
running), and each run's summary records the CPU seconds they used meanwhile. After the run,
and for saved runs with `--report A.json[,B.json]` (their rounds pooled; any venv), it prints
layerbatch's crossing over the best peer's with a bootstrap interval over the rounds
(bench/peers_crossing.py).

Writes bench/results/peers.json (or peers-quick.json) and the PNG beside it; server logs under
out/peers/. The pure parts (search, trace rescaling, summaries, table) are tested in
tests/test_peers_bench.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import platform
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: the repository root, for `bench.peers_crossing`
    sys.path.insert(0, str(ROOT))

from bench.peers_busy import busy_counters, busy_line, busy_shares  # noqa: E402
from bench.peers_crossing import (  # noqa: E402
    THRESHOLD,
    edge_crossing,
    ratio_interval,
    threshold_crossing,
)
from bench.peers_ideal import equivalent_ceiling_rps, ideal_crossing_rps  # noqa: E402

SERVERS = ("layerbatch", "triton", "ray", "torchserve")
PEERS = SERVERS[1:]
MODELS = ("resnet18", "mobilenet_v2", "googlenet")
TARGET_RATIO = 1.3  # the target: layerbatch's capacity over the best peer's
SPEED_CHANGE_WARN = 0.15  # warn when the batched ceiling moved by more than this during a run
SETTLE_PAIRS = 3  # tuning: pairs that settle the best knobs against the second best
WARM_LOAD_S = 8.0  # --interleave: unmeasured load each server serves first
THREADS = 2
AZURE_TRACE = ROOT / "traces" / "data" / "request_traces" / "AzureLLMInferenceTrace_code.csv"
MAIN_PY = ROOT / ".venv" / "bin" / "python"
FULL_LOAD = {"duration_s": 20.0, "min_requests": 200, "seed": 1}  # a full run's arrivals


# ----------------------------------------------------------------------------- pure parts


@dataclass(frozen=True)
class Knobs:
    """A server's knobs: at most `max_batch` requests per batch, waiting at most `delay_ms` for
    more (max_batch 0: the server has none to tune, i.e. layerbatch), on `workers` workers
    (TorchServe's workers, Triton's model instances, Ray Serve's replicas, layerbatch's
    `--replicas`) that split the THREADS torch threads between them."""

    max_batch: int = 0
    delay_ms: float = 0.0
    workers: int = 1

    @property
    def threads(self) -> int:
        """Torch threads per worker."""
        return max(1, THREADS // self.workers)

    @property
    def label(self) -> str:
        if self.max_batch == 0:
            return "default" if self.workers == 1 else f"{self.workers} replicas"
        base = "B=1" if self.max_batch == 1 else f"B={self.max_batch},{self.delay_ms:g}ms"
        return base if self.workers == 1 else f"{base},{self.workers}w"


UNTUNED = Knobs(8, 5.0)  # --interleave: a peer's knobs when no tuning run has any


def tuning_grid(
    batches: Sequence[int], delays: Sequence[float], workers: Sequence[int] = (1,)
) -> list[Knobs]:
    """Every (workers, max batch, max delay); with a batch of 1 the delay means nothing, so
    once."""
    out: list[Knobs] = []
    for w in workers:
        for b in batches:
            for d in [delays[0]] if b == 1 else delays:
                out.append(Knobs(int(b), float(d if b > 1 else 0.0), int(w)))
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class Sample:
    due_s: float  # when it was due to be sent, from the start of the run
    status: str  # "ok", "dropped", "timeout", "error", "http-<code>"
    ms: float  # from due time to answer (or to giving up)


def summarize(samples: Sequence[Sample], deadline_ms: float, duration_s: float) -> dict[str, Any]:
    """On-time ratio (answered OK within the deadline), mean and p99 of the answered-OK requests'
    completion times, and counts."""
    n = len(samples)
    ok = [s.ms for s in samples if s.status == "ok"]
    on_time = sum(1 for s in samples if s.status == "ok" and s.ms <= deadline_ms)
    return {
        "requests": n,
        "on_time_ratio": round(on_time / n, 4) if n else None,
        "served": len(ok),
        "dropped": sum(s.status == "dropped" for s in samples),
        "timeouts": sum(s.status == "timeout" for s in samples),
        "errors": sum(s.status not in ("ok", "dropped", "timeout") for s in samples),
        "mean_ms": round(float(np.mean(ok)), 2) if ok else None,
        "p99_ms": round(float(np.percentile(ok, 99)), 2) if ok else None,
        "goodput_rps": round(on_time / duration_s, 2) if duration_s > 0 else None,
    }


def round_rate(rate: float) -> float:
    """Rates are kept to 0.1 req/s (so that runs can be looked up by rate)."""
    return round(max(rate, 0.1), 1)


@dataclass
class RateSearch:
    """The capacity search on the rate: from `start`, grow (x`grow`) while on time, shrink while
    not, then bisect (geometric mean) until hi / lo <= 1 + tol. `lo`/`hi` may be known already
    (rates known on time / not). The capacity is `lo` (0 when no rate >= `min_rate` was)."""

    start: float
    tol: float = 0.1
    grow: float = 1.5
    min_rate: float = 0.5
    max_rate: float = 1000.0
    lo: float | None = None
    hi: float | None = None
    tried: list[tuple[float, bool]] = field(default_factory=list)

    def record(self, rate: float, ok: bool) -> None:
        self.tried.append((rate, ok))
        if ok and (self.lo is None or rate > self.lo):
            self.lo = rate
        if not ok and (self.hi is None or rate < self.hi):
            self.hi = rate
        if self.lo is not None and self.hi is not None and self.lo >= self.hi:
            # noise: a higher rate was on time, a lower one not; trust the lower failure
            self.lo = max((r for r, k in self.tried if k and r < self.hi), default=None)

    def next_rate(self) -> float | None:
        lo, hi = self.lo, self.hi
        if lo is None and hi is None:
            r = self.start
        elif lo is None:
            assert hi is not None
            if hi <= self.min_rate:
                return None
            r = max(hi / self.grow, self.min_rate)
        elif hi is None:
            if lo >= self.max_rate:
                return None
            r = min(lo * self.grow, self.max_rate)
        else:
            if hi / lo <= 1.0 + self.tol:
                return None
            r = math.sqrt(lo * hi)
        r = round_rate(r)
        if any(r == t for t, _ in self.tried):
            return None  # the rate grid is too coarse to go on
        return r

    @property
    def capacity(self) -> float:
        return self.lo or 0.0


def poisson_arrivals_s(rate: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    gaps = rng.exponential(1.0 / rate, int(rate * duration_s * 2) + 20)
    t = np.cumsum(gaps)
    out: np.ndarray = t[t < duration_s]
    return out


def trace_arrivals_s(
    timestamps_s: np.ndarray, rate: float, n: int, max_gap: float = 30.0
) -> np.ndarray:
    """The first `n` arrivals of the trace rescaled so that its mean rate (over the whole trace)
    is `rate` (traces/arrivals.py `recorded_ms`, looped if short), in seconds, with every idle gap
    longer than `max_gap` mean inter-arrivals cut to that (the Azure code trace falls silent for
    minutes; a server is idle either way, and a run should not wait for it). A count, not a
    duration: a run needs requests."""
    from traces.arrivals import recorded_ms

    t = recorded_ms(timestamps_s, rate, n) / 1000.0
    gaps = np.minimum(np.diff(t, prepend=t[:1]), max_gap / rate)
    out: np.ndarray = np.cumsum(gaps)
    return out


def compute_bound_rps(decode_ms: float, forward_ms: float, batch: int = 1) -> float:
    """The highest rate decodes + one forward of `batch` frames at a time can sustain: with
    batch 1 the compute bound; with full batches the ceiling of any server that batches whole
    models on this machine (with nothing else on its cores)."""
    return 1000.0 * batch / (batch * decode_ms + forward_ms)


def batched_ceiling_rps(bound: dict[str, Any]) -> float:
    """The batched ceiling of one compute-bound measurement (bench/peers_model.py): the best
    `compute_bound_rps` over its full-batch forwards, as the peers run the model or folded."""
    batched = [*bound["batched"].items(), *bound["batched_folded"].items()]
    return max(compute_bound_rps(bound["decode_ms"], ms, int(b)) for b, ms in batched)


def mean_bound(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The compute bound and batched ceiling measured before and after a model's servers (the
    machine is shared), with their means as `rps` and `batched_rps`, and how much faster the
    machine ran after than before as `speed_change` (the ceilings' ratio)."""
    return {
        "before": before,
        "after": after,
        **{k: round((before[k] + after[k]) / 2, 2) for k in ("rps", "batched_rps")},
        "speed_change": round(after["batched_rps"] / before["batched_rps"], 3),
    }


def speed_warning(bound: dict[str, Any]) -> str | None:
    """One line when the machine's speed (`mean_bound`'s speed_change) moved by more than
    SPEED_CHANGE_WARN during the run, else None (also for runs that did not record it)."""
    change = float(bound.get("speed_change", 1.0))
    if abs(change - 1.0) <= SPEED_CHANGE_WARN:
        return None
    return (
        f"warning: this machine's speed changed during the run (batched ceiling "
        f"{bound['before']['batched_rps']:.1f} req/s before, {bound['after']['batched_rps']:.1f} "
        f"after, x{change:.2f}): only measurements taken close together compare (--interleave "
        "measures the servers back to back at each rate), not capacities against the ceiling"
    )


def best_knobs(caps: dict[Knobs, tuple[float, float]]) -> Knobs:
    """The tuning winner: the highest capacity, then the highest on-time ratio at the first
    rate it failed (how close it came), then the earlier-listed."""
    return max(caps, key=lambda k: (caps[k][0], caps[k][1]))


def runner_up(caps: dict[Knobs, tuple[float, float]]) -> Knobs | None:
    """The second in `best_knobs`'s order; None where it had one knob or no capacity to go on."""
    ranked = sorted(caps, key=lambda k: caps[k], reverse=True)  # stable: ties keep grid order
    if len(ranked) < 2 or caps[ranked[0]][0] <= 0:
        return None
    return ranked[1]


def settled(pick: Knobs, other: Knobs, on_time: Mapping[Knobs, Sequence[float]]) -> Knobs:
    """Of the tuning's pick and its runner-up, measured in pairs on the same arrivals, the one
    with the higher mean on-time ratio; the pick where they tie."""
    return other if np.mean(on_time[other]) > np.mean(on_time[pick]) else pick


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def table_rows(
    results: Sequence[dict[str, Any]],
    bounds: Mapping[str, float],
    ceilings: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """One row per (model, deadline, arrival): every server's capacity (and knobs), the best
    peer, layerbatch / best peer, each capacity as a fraction of the compute bound, and the
    batched ceiling (`batched_ceiling_rps`) where `ceilings` has it."""
    keys = list(dict.fromkeys((r["model"], r["deadline_ms"], r["arrival"]) for r in results))
    rows = []
    for model, deadline, arrival in keys:
        mine = {
            r["server"]: r
            for r in results
            if (r["model"], r["deadline_ms"], r["arrival"]) == (model, deadline, arrival)
        }
        caps = {s: mine[s]["capacity_rps"] for s in mine}
        peers = {s: c for s, c in caps.items() if s != "layerbatch"}
        best_peer = max(peers, key=lambda s: peers[s]) if peers else None
        bound = bounds.get(model)
        rows.append(
            {
                "model": model,
                "deadline_ms": deadline,
                "arrival": arrival,
                "compute_bound_rps": round(bound, 2) if bound else None,
                "batched_ceiling_rps": (ceilings or {}).get(model),
                "capacity_rps": caps,
                "knobs": {s: mine[s]["knobs"] for s in mine},
                "fraction_of_bound": {s: ratio(c, bound) for s, c in caps.items()},
                "best_peer": best_peer,
                "layerbatch_over_best_peer": ratio(
                    caps.get("layerbatch"), peers[best_peer] if best_peer else None
                ),
            }
        )
    return rows


def format_table(rows: Sequence[dict[str, Any]], servers: Sequence[str]) -> str:
    head = f"{'model':<13}{'deadline':>9} {'arrival':<8}{'bound':>7}{'ceiling':>8}"
    head += "".join(f"{s:>12}" for s in servers) + f"{'best peer':>12}{'lb/peer':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = f"{r['model']:<13}{r['deadline_ms']:>7g}ms {r['arrival']:<8}"
        line += f"{r['compute_bound_rps'] or 0:>7.1f}{r.get('batched_ceiling_rps') or 0:>8.1f}"
        for s in servers:
            c = r["capacity_rps"].get(s)
            f = r["fraction_of_bound"].get(s)
            line += f"{'-':>12}" if c is None else f"{c:>6.1f} ({f or 0:.2f})"
        lb = r["layerbatch_over_best_peer"]
        line += f"{r['best_peer'] or '-':>12}{'-' if lb is None else f'{lb:.2f}':>9}"
        lines.append(line)
    lines.append(
        "capacity req/s at on-time ratio >= 0.9 (fraction of the compute bound); ceiling: "
        "decodes + full-batch forwards"
    )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the servers


def free_port(span: int = 5) -> int:
    """A port p with p .. p + span - 1 free (Triton uses the next two, TorchServe four: its
    management, metrics and two gRPC ports, which default to fixed ones that a second
    TorchServe beside it could not bind)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = int(s.getsockname()[1])
        if p + span >= 65535:
            continue
        try:
            socks = []
            for q in range(p, p + span):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no free ports")


@dataclass(frozen=True)
class Protocol:
    """How the load generator talks to one server: the URL path, the body of one request, and
    what an answer means."""

    server: str
    model: str

    @property
    def path(self) -> str:
        return {
            "layerbatch": "/v1/infer",
            "triton": f"/v2/models/{self.model}/infer",
            "ray": f"/{self.model}",
            "torchserve": f"/predictions/{self.model}",
        }[self.server]

    def request(self, jpeg: bytes, deadline_ms: float) -> tuple[bytes, dict[str, str]]:
        if self.server == "layerbatch":
            import msgpack

            body = {"app": self.model, "deadline_ms": deadline_ms, "payload": {"jpeg": jpeg}}
            data: bytes = msgpack.packb(body, use_bin_type=True)
            return data, {"Content-Type": "application/msgpack"}
        if self.server == "triton":
            return triton_body(jpeg)
        return jpeg, {"Content-Type": "application/octet-stream"}

    def answer(self, http_status: int, raw: bytes) -> tuple[str, int | None]:
        """(status, top-1 class or None)."""
        if http_status != 200:
            return f"http-{http_status}", None
        try:
            if self.server == "layerbatch":
                import msgpack

                doc = msgpack.unpackb(raw)
                status = str(doc.get("status", "error"))
                top = doc.get("result", {}).get("top5") if status == "ok" else None
                return status, int(top[0]["class"]) if top else None
            doc = json.loads(raw)
            if self.server == "triton":
                out = {o["name"]: o["data"] for o in doc["outputs"]}
                return "ok", int(out["classes"][0])
            return "ok", int(doc["classes"][0])
        except (ValueError, KeyError, TypeError, IndexError):
            return "error", None


def triton_body(jpeg: bytes) -> tuple[bytes, dict[str, str]]:
    """A KServe v2 request with the JPEG as one BYTES element in Triton's binary extension (the
    JSON header, then the element as a 4-byte little-endian length and the bytes)."""
    blob = struct.pack("<I", len(jpeg)) + jpeg
    header = {
        "inputs": [
            {
                "name": "jpeg",
                "shape": [1, 1],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(blob)},
            }
        ],
        "outputs": [
            {"name": "classes", "parameters": {"binary_data": False}},
            {"name": "scores", "parameters": {"binary_data": False}},
        ],
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    return head + blob, {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(head)),
    }


def server_command(
    server: str,
    model: str,
    knobs: Knobs,
    deadline_ms: float,
    port: int,
    policy: str,
    fold_peers: bool = False,
    step_log: Path | None = None,
) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PEERS_TORCH_THREADS": str(knobs.threads)}
    env["PEERS_FOLD_BN"] = "1" if fold_peers else "0"
    here = ROOT / "bench"
    if server == "layerbatch":
        cmd = [str(MAIN_PY), "-m", "layerbatch", "serve", "--apps", model]
        cmd += ["--threads", str(knobs.threads), "--port", str(port), "--policy", policy]
        cmd += ["--deadline-ms", f"{deadline_ms:g}"]
        if knobs.workers > 1:
            cmd += ["--replicas", str(knobs.workers)]
        if step_log is not None:
            cmd += ["--step-log", str(step_log)]
        return cmd, env
    py = sys.executable
    common = ["--model", model, "--port", str(port), "--max-batch", str(knobs.max_batch)]
    common += ["--delay-ms", f"{knobs.delay_ms:g}", "--workers", str(knobs.workers)]
    if server == "triton":
        libdir = str(sysconfig.get_config_var("LIBDIR"))
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libdir, os.environ.get("LD_LIBRARY_PATH", "")) if p
        )
        return [
            py,
            str(here / "peers_triton.py"),
            *common,
            "--deadline-ms",
            f"{deadline_ms:g}",
        ], env
    if server == "ray":
        return [py, str(here / "peers_ray.py"), *common], env
    if server == "torchserve":
        return [py, str(here / "peers_torchserve.py"), *common], env
    raise ValueError(f"unknown server {server!r}: expected one of {', '.join(SERVERS)}")


def session_pids(sid: int) -> list[int]:
    """The ids of the processes now in session `sid` (a server's, with every process it started:
    Ray's workers each lead a process group of their own, but stay in its session)."""
    out = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True)
    return [
        int(p)
        for p, s in (ln.split() for ln in out.stdout.splitlines() if ln.strip())
        if int(s) == sid
    ]


def proc_stat(pid: int) -> list[str]:
    """A process's /proc/PID/stat fields from field 3 (its state letter) on, after the command
    name (which may hold spaces); raises OSError once the process is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def session_cpu_s(sid: int) -> float:
    """The CPU seconds (user and system) used so far by the processes now in session `sid`."""
    total_ticks = 0
    for pid in session_pids(sid):
        try:
            fields = proc_stat(pid)
        except OSError:  # gone since it was listed
            continue
        total_ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total_ticks / os.sysconf("SC_CLK_TCK")


def signal_session(sid: int, sig: signal.Signals) -> None:
    """Send `sig` to every process now in session `sid` (those gone meanwhile: nothing)."""
    for pid in session_pids(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class Running:
    """One server process (its own session, so that everything it started stops with it)."""

    def __init__(
        self,
        server: str,
        model: str,
        knobs: Knobs,
        deadline_ms: float,
        logdir: Path,
        policy: str = "dp-tardy",
        fold_peers: bool = False,
        step_log: bool = False,
        root: Path = ROOT,
    ) -> None:
        """`step_log`: layerbatch writes its steps beside its log, as .steps.jsonl. `root`: the
        checkout layerbatch's server runs from (its working directory, which `python -m`
        imports from first), this one by default."""
        self.server, self.model, self.knobs = server, model, knobs
        self.deadline_ms = deadline_ms  # the one it was started with (Triton's queue policy)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        logdir.mkdir(parents=True, exist_ok=True)
        self.log = logdir / f"{server}-{model}-{knobs.label.replace(',', '_')}-{self.port}.log"
        steps = self.log.with_suffix(".steps.jsonl") if step_log else None
        cmd, env = server_command(
            server, model, knobs, deadline_ms, self.port, policy, fold_peers, steps
        )
        self._logf = self.log.open("wb")
        self.proc = subprocess.Popen(
            cmd, stdout=self._logf, stderr=subprocess.STDOUT, env=env, cwd=root,
            start_new_session=True,
        )  # fmt: skip
        self.started = time.monotonic()
        self.ready_s: float | None = None
        self.pids: list[int] = []

    def descendants(self) -> list[int]:
        """The process ids in this server's session."""
        return session_pids(self.proc.pid)

    def cpu_s(self) -> float:
        return session_cpu_s(self.proc.pid)

    def pause(self, paused: bool) -> None:
        """Stop (SIGSTOP) or continue (SIGCONT) every process in this server's session."""
        signal_session(self.proc.pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM to the server's process group (it stops what it started), then SIGKILL to
        whatever is left in its session."""
        self.pause(False)  # a stopped process would not act on SIGTERM
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        for wait_s in (15.0, 10.0):
            end = time.monotonic() + wait_s
            while time.monotonic() < end and self.descendants():
                self.proc.poll()
                time.sleep(0.3)
            if not self.descendants():
                break
            signal_session(self.proc.pid, signal.SIGKILL)
        self.proc.poll()
        self._logf.close()

    def tail(self, n: int = 1500) -> str:
        return self.log.read_bytes()[-n:].decode(errors="replace")


# ----------------------------------------------------------------------------- the load


class ExitedEarly(RuntimeError):
    """A server's process ended before it answered its first request."""


class Load:
    """The open-loop load generator for one running server: the same arrivals and frames for
    every server, each request in that server's protocol."""

    def __init__(self, run: Running, frames: Sequence[bytes], deadline_ms: float) -> None:
        import aiohttp

        self.run = run
        self.proto = Protocol(run.server, run.model)
        self.frames = frames
        self.set_deadline(deadline_ms)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        self.idle_ms: float | None = None
        self.top1: int | None = None

    def set_deadline(self, deadline_ms: float) -> None:
        """The deadline requests carry (layerbatch's) and the client gives up at."""
        self.deadline_ms = deadline_ms
        self.bodies = [self.proto.request(f, deadline_ms) for f in self.frames]

    async def close(self) -> None:
        await self.session.close()

    async def busy(self) -> dict[str, float] | None:
        """layerbatch's busy counters (bench/peers_busy.py); None for the peers."""
        if self.run.server != "layerbatch":
            return None
        async with self.session.get(self.run.url + "/metrics") as r:
            return busy_counters(await r.text())

    async def one(self, i: int, give_up_s: float) -> tuple[str, float, int | None]:
        import aiohttp

        loop = asyncio.get_running_loop()
        body, headers = self.bodies[i % len(self.bodies)]
        t0 = loop.time()
        try:
            async with self.session.post(
                self.run.url + self.proto.path,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=give_up_s),
            ) as r:
                raw = await r.read()
                status, top1 = self.proto.answer(r.status, raw)
        except TimeoutError:
            status, top1 = "timeout", None
        except (aiohttp.ClientError, OSError):
            status, top1 = "error", None
        return status, (loop.time() - t0) * 1000.0, top1

    async def ready(self, timeout_s: float = 600.0) -> None:
        """Until a probe is answered OK (then a short warm-up and the idle latency)."""
        end = time.monotonic() + timeout_s
        while True:
            if self.run.proc.poll() is not None:
                raise ExitedEarly(
                    f"{self.run.server} exited ({self.run.proc.returncode}):\n{self.run.tail()}"
                )
            status, _, top1 = await self.one(0, 30.0)
            if status == "ok":
                self.top1 = top1
                break
            if time.monotonic() > end:
                raise RuntimeError(f"{self.run.server} not ready in {timeout_s:g} s")
            await asyncio.sleep(1.0)
        self.run.ready_s = time.monotonic() - self.run.started
        lat = [(await self.one(i, 30.0))[1] for i in range(12)]
        self.idle_ms = float(np.median(lat[4:]))

    async def quiesce(self, max_s: float = 60.0) -> float:
        """Wait until a backlog left by an overloaded run (e.g. requests the client gave up on,
        which TorchServe and Triton still run) has drained: until a probe is answered within
        max(2 x the idle latency + 30 ms, half the deadline); after 20 s, also once two probes in
        a row take about as long (no longer draining: the machine is just busier now)."""
        assert self.idle_ms is not None
        t0 = time.monotonic()
        ok_ms = max(2.0 * self.idle_ms + 30.0, 0.5 * self.deadline_ms)
        prev: float | None = None
        while time.monotonic() - t0 < max_s:
            status, ms, _ = await self.one(0, 30.0)
            if status == "ok" and (
                ms <= ok_ms
                or (time.monotonic() - t0 > 20.0 and prev is not None and ms >= 0.9 * prev)
            ):
                break
            prev = ms if status == "ok" else None
            await asyncio.sleep(0.3)
        return time.monotonic() - t0

    async def run_arrivals(self, arrivals_s: np.ndarray, give_up_s: float) -> list[Sample]:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.05

        async def send(i: int, due: float) -> Sample:
            status, _, _ = await self.one(i, give_up_s)
            return Sample(due, status, (loop.time() - (start + due)) * 1000.0)

        tasks = []
        for i, due in enumerate(arrivals_s):
            delay = start + float(due) - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(i, float(due))))
        return list(await asyncio.gather(*tasks))


@dataclass(frozen=True)
class Run:
    """One measured rate: its samples, how long the arrivals lasted and, where the server died
    during them, its exit status."""

    samples: list[Sample]
    duration_s: float
    server_exited: int | None = None

    def summary(self, deadline_ms: float) -> dict[str, Any]:
        s = summarize(self.samples, deadline_ms, self.duration_s)
        return s if self.server_exited is None else {**s, "server_exited": self.server_exited}


Cache = dict[tuple[str, float], Run]  # (arrival, rate) -> run, for one server start


@dataclass
class Settings:
    models: list[str]
    deadlines: list[float]
    servers: list[str]
    arrivals: list[str]
    grid: list[Knobs]
    duration_s: float
    tune_duration_s: float
    min_requests: int
    tol: float
    tune_tol: float
    seed: int
    policy: str
    out: Path
    logdir: Path
    profile_s: float
    profile_rate: float | None
    interleave: list[float]
    rounds: int
    fold_peers: bool = False
    layerbatch_replicas: tuple[int, ...] = (1,)
    pause_idle: bool = True
    report: list[Path] = field(default_factory=list)
    step_log: bool = False
    settle_pairs: int = SETTLE_PAIRS


def arrivals_for(
    kind: str, rate: float, duration_s: float, seed: int, trace: np.ndarray, count: int
) -> Any:
    """Poisson arrivals for `duration_s`, or the trace's first `count` arrivals rescaled to
    `rate`: the same arrivals at every rate, compressed, so that a higher rate means the same
    bursts closer together (a count that grew with the rate would also bring later, different
    bursts into a run)."""
    if kind == "poisson":
        return poisson_arrivals_s(rate, duration_s, np.random.default_rng([seed, int(rate * 10)]))
    return trace_arrivals_s(trace, rate, max(2, count))


async def measure_alone(
    load: Load,
    others: Mapping[str, Load],
    arrivals_s: np.ndarray,
    duration_s: float,
    deadline_ms: float,
    pause: bool = True,
) -> dict[str, Any]:
    """`load`'s server serves `arrivals_s` while `others` (servers up beside it) are idle, and
    stopped (SIGSTOP) with `pause`; its summary, with the CPU seconds each other server used
    meanwhile ("others_cpu_s"), the client's share of a core and, where the server says, its
    busy shares. The interleaved runs, the tuning's settling and `bench/server_ab.py` all measure
    a server this way."""
    runs = {n: x.run for n, x in others.items()}
    await load.quiesce()  # e.g. timers it missed while paused
    cpu0_s = {n: r.cpu_s() for n, r in runs.items()}
    try:
        if pause:
            for r in runs.values():
                r.pause(True)
        busy0, t0_s = await load.busy(), time.monotonic()
        client0_s = time.process_time()
        samples = await load.run_arrivals(arrivals_s, deadline_ms / 1000.0)
        client_cpu_s = time.process_time() - client0_s
        wall_ms = (time.monotonic() - t0_s) * 1000.0
        busy1 = await load.busy()
        await load.quiesce()
        others_cpu_s = {n: r.cpu_s() - cpu0_s[n] for n, r in runs.items()}
    finally:
        for r in runs.values():
            r.pause(False)
    s = summarize(samples, deadline_ms, duration_s)
    s["others_cpu_s"] = {n: round(v, 2) for n, v in others_cpu_s.items()}
    s["client_cpu_share"] = round(client_cpu_s * 1000.0 / wall_ms, 4)
    if busy0 is not None and busy1 is not None:
        s["busy_share"] = busy_shares(busy0, busy1, wall_ms)
    return s


class Bench:
    def __init__(self, st: Settings, frames: list[bytes], trace: np.ndarray) -> None:
        self.st, self.frames, self.trace = st, frames, trace
        self.results: list[dict[str, Any]] = []
        self.tuning: list[dict[str, Any]] = []
        self.settled: list[dict[str, Any]] = []
        self.bounds: dict[str, dict[str, Any]] = {}
        self.checks: dict[str, dict[str, Any]] = {}

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
        """`load`'s run at `rate`, measured once per server start (`cache`). A server found dead
        is started again first (`revive`); one that dies during the run is measured again once,
        and where it dies again the run is kept, with its exit status, as what it served."""
        key = (arrival, rate)
        if key not in cache:
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
            cache[key] = Run(samples, dur, exited)
            if exited is None:
                await load.quiesce()
        return cache[key]

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
    ) -> RateSearch:
        rs = RateSearch(start, tol)
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
    def runs_table(cache: Cache, arrival: str, deadline: float) -> dict[str, dict[str, Any]]:
        return {
            f"{rate:g}": run.summary(deadline)
            for (a, rate), run in sorted(cache.items(), key=lambda kv: kv[0][1])
            if a == arrival
        }

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
        return chosen

    async def server_model(self, server: str, model: str, bound: float) -> None:
        """Tune (peers), then measure the best knobs per deadline, for each arrival process.
        A peer is tuned under each arrival process it is measured under: knobs best for Poisson
        arrivals need not be best for the bursty trace (TorchServe's were not)."""
        st = self.st
        grid = layerbatch_grid(st) if server == "layerbatch" else st.grid
        # a server that is given the deadline at start (Triton's queue policy) runs per deadline;
        # layerbatch takes it per request, the others ignore it: one start serves every deadline
        groups = [[d] for d in st.deadlines] if server == "triton" else [st.deadlines]
        for group in groups:
            cases = [(d, a) for d in group for a in st.arrivals]
            tuned: dict[tuple[float, str], dict[Knobs, tuple[float, float]]] = {
                c: {} for c in cases
            }
            coarse: dict[Knobs, Cache] = {}
            if len(grid) > 1:
                for knobs in grid:
                    load = await self.start(server, model, knobs, group[0])
                    try:
                        cache: Cache = {}
                        coarse[knobs] = cache
                        for d, arrival in cases:
                            load.set_deadline(d)
                            start = self._start_rate(model, d, arrival, bound)
                            rs = await self.search(
                                load, cache, arrival, d, start, st.tune_tol, True
                            )
                            fails = [r for r, ok in rs.tried if not ok]
                            near = (
                                cache[(arrival, min(fails))].summary(d)["on_time_ratio"]
                                if fails
                                else 1.0
                            )
                            tuned[(d, arrival)][knobs] = (rs.capacity, near or 0.0)
                            self.tuning.append(
                                {
                                    "server": server,
                                    "model": model,
                                    "deadline_ms": d,
                                    "arrival": arrival,
                                    "knobs": asdict(knobs),
                                    "capacity_rps": rs.capacity,
                                    "on_time_at_first_failure": near,
                                    "runs": self.runs_table(cache, arrival, d),
                                }
                            )
                    finally:
                        await self.stop(load)
            best = {
                c: await self.settle(server, model, c, tuned[c], group[0]) if tuned[c] else grid[0]
                for c in cases
            }
            for knobs in dict.fromkeys(best.values()):
                load = await self.start(server, model, knobs, group[0])
                try:
                    cache = {}
                    for d, arrival in [c for c in cases if best[c] == knobs]:
                        load.set_deadline(d)
                        prior = coarse.get(knobs, {})
                        known = [
                            (rate, (run.summary(d)["on_time_ratio"] or 0) >= THRESHOLD)
                            for (a, rate), run in prior.items()
                            if a == arrival
                        ]
                        lo = max((r for r, ok in known if ok), default=None)
                        hi = min((r for r, ok in known if not ok), default=None)
                        seeds = [(r, ok) for r, ok in ((lo, True), (hi, False)) if r]
                        start = self._start_rate(model, d, arrival, bound)
                        rs = await self.search(
                            load, cache, arrival, d, start, st.tol, False, known=seeds
                        )
                        self.results.append(
                            {
                                "server": server,
                                "model": model,
                                "deadline_ms": d,
                                "arrival": arrival,
                                "knobs": knobs.label,
                                "tuned_under": arrival if len(grid) > 1 else None,
                                "capacity_rps": rs.capacity,
                                "runs": self.runs_table(cache, arrival, d),
                                "tuning_runs_at_these_knobs": self.runs_table(prior, arrival, d)
                                if prior
                                else {},
                            }
                        )
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
        doc["rps"] = round(compute_bound_rps(doc["decode_ms"], doc["forward_ms"]), 2)
        doc["batched_rps"] = round(batched_ceiling_rps(doc), 2)
        return doc

    async def model(self, model: str) -> None:
        before = await asyncio.to_thread(self.compute_bound, model)
        print(
            f"[{model}] compute bound: decode {before['decode_ms']:.1f} ms + forward "
            f"{before['forward_ms']:.1f} ms ({before['layout']}) = {before['rps']:.1f} req/s; "
            f"batched ceiling {before['batched_rps']:.1f} req/s",
            flush=True,
        )
        self.bounds[model] = {"before": before}
        for server in self.st.servers:
            print(f"[{model}] {server}", flush=True)
            await self.server_model(server, model, before["rps"])
        after = await asyncio.to_thread(self.compute_bound, model)
        self.bounds[model] = mean_bound(before, after)
        print(
            f"[{model}] compute bound after: {after['rps']:.1f} req/s "
            f"(mean {self.bounds[model]['rps']:.1f}), batched ceiling {after['batched_rps']:.1f}",
            flush=True,
        )
        warning = speed_warning(self.bounds[model])
        if warning:
            print(f"[{model}] {warning}", flush=True)


# ----------------------------------------------------------------------------- the profile

# where a sampled stack's time goes: the first category (in this order) whose pattern is in
# the stack; patterns are substrings of py-spy's "function (file:line)" frames
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("decode (imdecode, resize, normalise)", ("imdecode", "image_tensor", "rgb_tensor", "_decode")),
    ("forward (torch modules)", ("torch/nn/modules", "torch/fx", "_call_impl", "GraphModule")),
    (
        "copies (gather/scatter, stack, layout)",
        ("stack", "_gather", "scatter", "contiguous", "cat ("),
    ),
    ("planning (scheduler)", ("scheduler/",)),
    ("results (softmax, top-5, describe)", ("results.py", "describe")),
    ("HTTP + msgpack (aiohttp, wire)", ("aiohttp", "msgpack", "wire.py", "web_protocol")),
    ("event loop (asyncio)", ("asyncio/", "base_events", "selectors")),
    (
        "thread hand-offs (futures, queues, locks)",
        ("concurrent/futures", "threading.py", "queue.py"),
    ),
)


def categorize(stack: str) -> str:
    """The category of the innermost frame of `stack` (frames joined by ";") that has one."""
    for frame in reversed(stack.split(";")):
        for name, pats in CATEGORIES:
            if any(p in frame for p in pats):
                return name
    return "other"


def profile_breakdown(raw_lines: Sequence[str], top: int = 25) -> dict[str, Any]:
    """py-spy raw (collapsed) stacks, `thread (tid);frame;...;frame count` per line, as: samples
    per thread, per category (see CATEGORIES) per thread, and the top self-time frames."""
    threads: dict[str, int] = {}
    cats: dict[str, dict[str, int]] = {}
    leaves: dict[str, int] = {}
    total = 0
    for ln in raw_lines:
        ln = ln.strip()
        if not ln or " " not in ln:
            continue
        stack, _, count_s = ln.rpartition(" ")
        try:
            count = int(count_s)
        except ValueError:
            continue
        frames = stack.split(";")
        thread = frames[0] if frames[0].startswith(("thread", "process")) else "?"
        if thread.startswith("process") and len(frames) > 1 and frames[1].startswith("thread"):
            thread = frames[1]
        total += count
        threads[thread] = threads.get(thread, 0) + count
        c = cats.setdefault(thread, {})
        cat = categorize(stack)
        c[cat] = c.get(cat, 0) + count
        leaves[frames[-1]] = leaves.get(frames[-1], 0) + count
    return {
        "samples": total,
        "threads": dict(sorted(threads.items(), key=lambda kv: -kv[1])),
        "categories": {
            t: dict(sorted(v.items(), key=lambda kv: -kv[1]))
            for t, v in sorted(cats.items(), key=lambda kv: -threads[kv[0]])
        },
        "top_self": dict(sorted(leaves.items(), key=lambda kv: -kv[1])[:top]),
    }


async def profile_layerbatch(
    st: Settings, frames: list[bytes], model: str, rate: float, seconds: float, deadline: float
) -> dict[str, Any]:
    """layerbatch serving Poisson load at `rate` while py-spy samples its process (100 Hz,
    every thread, on-CPU stacks only; a second pass with idle stacks shows where threads wait)."""
    spy = Path(sys.executable).parent / "py-spy"
    out: dict[str, Any] = {"model": model, "rate_rps": rate, "deadline_ms": deadline}
    run = Running("layerbatch", model, layerbatch_grid(st)[-1], deadline, st.logdir, st.policy)
    load = Load(run, frames, deadline)
    try:
        await load.ready()
        for mode, extra in (("cpu", []), ("idle", ["--idle"])):
            raw = st.logdir / f"profile-layerbatch-{model}-{mode}.txt"
            cmd = [str(spy), "record", "-p", str(run.proc.pid), "-d", f"{seconds:g}", "-r", "100"]
            cmd += ["--threads", "--nonblocking", "-f", "raw", "-o", str(raw), *extra]
            spy_proc = await asyncio.create_subprocess_exec(
                *cmd, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
            )
            arr = poisson_arrivals_s(rate, seconds, np.random.default_rng([st.seed, 99]))
            samples = await load.run_arrivals(arr, deadline / 1000.0)
            _, err = await spy_proc.communicate()
            if spy_proc.returncode != 0:
                raise RuntimeError(f"py-spy failed: {err.decode()[-500:]}")
            out[mode] = {
                "load": summarize(samples, deadline, seconds),
                **profile_breakdown(raw.read_text().splitlines()),
                "raw": str(raw.relative_to(ROOT)),
            }
            await load.quiesce()
        import aiohttp

        async with aiohttp.ClientSession() as s, s.get(f"{run.url}/metrics") as r:
            out["metrics"] = [
                ln
                for ln in (await r.text()).splitlines()
                if ln.startswith(
                    ("layerbatch_plan", "layerbatch_step", "layerbatch_batch", "layerbatch_busy")
                )
                and not ln.startswith("#")
            ][:80]
        async with aiohttp.ClientSession() as s, s.get(f"{run.url}/v1/status") as r:
            out["status"] = await r.json()
    finally:
        await load.close()
        run.stop()
    return out


# ----------------------------------------------------------------------------- interleaved A/B


def knobs_from_label(label: str) -> Knobs:
    """The inverse of Knobs.label: "default", "2 replicas", "B=1", "B=8,5ms", "B=8,5ms,2w"."""
    if label == "default":
        return Knobs()
    if label.endswith(" replicas"):
        return Knobs(workers=int(label.removesuffix(" replicas")))
    parts = label.removeprefix("B=").split(",")
    workers = int(parts.pop().removesuffix("w")) if parts[-1].endswith("w") else 1
    if parts == ["1"]:
        return Knobs(1, 0.0, workers)
    return Knobs(int(parts[0]), float(parts[1].removesuffix("ms")), workers)


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
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "model": model,
        "deadline_ms": deadline,
        "arrival": arrival,
        "rounds": rounds,
        "fold_peers": st.fold_peers,
        "paused_idle": st.pause_idle,
        "compute_bound": {"before": await asyncio.to_thread(bench.compute_bound, model)},
    }
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {s: {} for s in knobs}
    try:
        for server, k in knobs.items():
            loads[server] = await bench.start(server, model, k, deadline)
        await bench.warm(loads.values(), rates[0], deadline)
        for rnd in range(rounds):
            for rate in rates:
                order = list(knobs) if rnd % 2 == 0 else list(reversed(knobs))
                for server in order:
                    if await bench.revive(loads[server], rate):
                        out.setdefault("restarts", {}).setdefault(server, []).append(
                            {"round": rnd, "rps": rate}
                        )
                    arr, dur = bench.arrivals(arrival, rate, False, st.seed + rnd)
                    others = {n: x for n, x in loads.items() if n != server}
                    s = await bench.alone(loads[server], others, arr, dur, deadline)
                    runs[server].setdefault(f"{rate:g}", []).append(s)
                    print(
                        f"  round {rnd} {rate:>5.1f} req/s {server:<11} {round_line(s)}",
                        flush=True,
                    )
    finally:
        for load in loads.values():
            await bench.stop(load)
    before = out["compute_bound"]["before"]
    out["compute_bound"] = mean_bound(before, await asyncio.to_thread(bench.compute_bound, model))
    out["knobs"] = {s: k.label for s, k in knobs.items()}
    out["runs"] = runs
    out["mean_on_time"] = mean_on_time(runs)
    return out


def round_line(s: Mapping[str, Any]) -> str:
    """One measured round as `--interleave` prints it; errors and a server that died are said."""
    return (
        f"on-time {s['on_time_ratio']:.3f} mean {s['mean_ms'] or 0:6.1f} "
        f"p99 {s['p99_ms'] or 0:6.1f} dropped {s['dropped']} timeouts {s['timeouts']} "
        + (f"errors {s['errors']} " if s.get("errors") else "")
        + (f"SERVER EXITED ({s['server_exited']}) " if "server_exited" in s else "")
        + f"others' CPU {sum(s['others_cpu_s'].values()):.1f} s "
        f"client {s['client_cpu_share']:.0%} of a core"
        + (f"; {busy_line(s['busy_share'])}" if "busy_share" in s else "")
    )


def mean_on_time(runs: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]]) -> dict[str, Any]:
    """Per server and rate, the mean on-time ratio over the rounds' summaries."""
    return {
        s: {
            r: round(float(np.mean([x["on_time_ratio"] or 0.0 for x in v])), 4)
            for r, v in per.items()
        }
        for s, per in runs.items()
    }


def layerbatch_grid(st: Settings) -> list[Knobs]:
    """layerbatch's knobs to tune over: its replica counts (`--layerbatch-replicas`), fewest first."""
    return [Knobs(workers=r) for r in st.layerbatch_replicas]


def tuning_records(
    out: Path, model: str, arrival: str = "poisson"
) -> list[tuple[Path, dict[str, Any]]]:
    """`model`'s results under `arrival` arrivals, at knobs tuned under them, from the runs on
    record beside `out` (`out` itself, then peers-quick.json, then peers-quick-MODEL.json and
    peers-quick-MODEL-*.json, e.g. a tuning run at another deadline), each with its file. Runs
    from before per-arrival tuning (no "tuned_under") were tuned under Poisson arrivals. Under a
    trace each record also carries `tuned_on_arrivals`, how many of the trace's first arrivals
    its tuning measured (its --min-requests), where the file says."""
    files = [out, out.with_name("peers-quick.json"), out.with_name(f"peers-quick-{model}.json")]
    files += sorted(out.parent.glob(f"peers-quick-{model}-*.json"))
    found: list[tuple[Path, dict[str, Any]]] = []
    for p in (f for f in files if f.exists()):
        doc = json.loads(p.read_text())
        count = doc.get("settings", {}).get("min_requests") if arrival != "poisson" else None
        found += [
            (p, {**r, "tuned_on_arrivals": count} if count else r)
            for r in doc["results"]
            if (r["model"], r["arrival"], r.get("tuned_under") or "poisson")
            == (model, arrival, arrival)
        ]
    return found


def knobs_on_record(
    out: Path, model: str, deadline_ms: float, arrival: str = "poisson", count: int = 0
) -> dict[str, tuple[Knobs, str]]:
    """Each server's best knobs from the tuning runs on record (`tuning_records`), with where
    they came from, the first found of: tuned under `arrival` at `deadline_ms`, under `arrival`
    at another deadline, then the same two under Poisson arrivals (layerbatch's only where it
    was tuned over replica counts). Under a trace, where says on how many of its first arrivals
    the knobs were tuned, and whether that differs from `count`, the run's: more arrivals bring
    other bursts (the Azure trace's arrivals 151-200 are one burst)."""
    found: dict[str, tuple[Knobs, str]] = {}
    for tuned_under in dict.fromkeys(["poisson", arrival]):  # lowest priority first
        exact: dict[str, tuple[Knobs, str]] = {}
        other: dict[str, tuple[Knobs, str]] = {}
        for p, r in tuning_records(out, model, tuned_under):
            if r["server"] == "layerbatch" and not r.get("tuned_under"):
                continue  # a run at one replica count: its knobs were given, not tuned
            into = exact if r["deadline_ms"] == deadline_ms else other
            where = f"tuned under {tuned_under} arrivals at {r['deadline_ms']:g} ms"
            if n := r.get("tuned_on_arrivals"):
                differs = f", not this run's {count}" if count and n != count else ""
                where += f" on its first {n}{differs}"
            where += f", {p.name}"
            into.setdefault(r["server"], (knobs_from_label(r["knobs"]), where))
        found.update({**other, **exact})
    return found


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


def report_interleaved(doc: dict[str, Any], png: Path, rng: np.random.Generator) -> None:
    """Print an --interleave document's table, crossings, bounds and layerbatch / best peer
    with its interval over the rounds (`bench.peers_crossing`), and plot it to `png`."""
    model = doc["model"]
    rows = interleaved_results(doc)
    bound = float(doc["compute_bound"]["rps"])
    ceiling = doc["compute_bound"].get("batched_rps")  # not measured by the oldest runs
    plot(rows, {model: bound}, png, {model: float(ceiling)} if ceiling else None)
    servers = list(doc["mean_on_time"])
    rates = sorted({float(r) for per in doc["mean_on_time"].values() for r in per})
    print(f"{'rate':>6}" + "".join(f"{s:>12}" for s in servers))
    for rate in rates:
        cells = [doc["mean_on_time"][s].get(f"{rate:g}") for s in servers]
        print(f"{rate:>6g}" + "".join(f"{'-' if v is None else f'{v:.3f}':>12}" for v in cells))
    for row in rows:
        print(f"{row['server']}: crosses {THRESHOLD} at {capacity_text(row)} req/s")
    print(
        f"compute bound {bound:g} req/s, batched ceiling "
        + (f"{ceiling:g} (means of before and after)" if ceiling else "not measured")
    )
    warning = speed_warning(doc["compute_bound"])
    if warning:
        print(warning)
    interval = ratio_interval(rounds_of(doc), rng)
    if interval is not None:
        print(f"layerbatch / best peer: {interval.text()}")
    peers = [v for server, v in crossings(rows).items() if server != "layerbatch"]
    best_peer = max(peers, default=0.0)
    ideal = None
    if ceiling:
        arrivals_at, deadline_ms = run_arrivals(doc), float(doc["deadline_ms"])
        ideal = ideal_crossing_rps(arrivals_at, deadline_ms, float(ceiling))
        # beyond the measured rates a crossing is a bound, and so is its equivalent ceiling
        qualifier = {"above": "at least ", "below": "at most ", "": ""}
        parts = []
        for server, per in doc["mean_on_time"].items():
            rate, side = edge_crossing({float(r): v for r, v in per.items()})
            rps = equivalent_ceiling_rps(arrivals_at, deadline_ms, rate)
            parts.append(
                f"{server} {qualifier[side]}{rps:.1f} ({rps / float(ceiling):.2f} of the ceiling)"
            )
        each = ", ".join(parts)
        print(
            f"an ideal server at the ceiling (bench/peers_ideal.py) crosses {THRESHOLD} at "
            f"{ideal:.1f} req/s under these arrivals"
            + (f"; each server crosses where it would at a ceiling of {each}" if each else "")
        )
    if best_peer:
        target = TARGET_RATIO * best_peer
        share = f": {target / ceiling:.2f} of the ceiling" if ceiling else ""
        share += f", {target / ideal:.2f} of the ideal server's crossing" if ideal else ""
        print(f"{TARGET_RATIO:g}x the best peer's {best_peer:g} req/s is {target:.1f}{share}")


def run_arrivals(doc: Mapping[str, Any]) -> Callable[[float], np.ndarray]:
    """An --interleave document's arrivals at any rate: its first round's, regenerated from its
    `load` (runs saved before it recorded one used a full run's, `FULL_LOAD`)."""
    from traces.arrivals import load_timestamps

    load = {**FULL_LOAD, **doc.get("load", {})}
    count = int(load["min_requests"])
    trace = load_timestamps(AZURE_TRACE) if doc["arrival"] != "poisson" else np.empty(0)

    def arrivals_at(rate: float) -> np.ndarray:
        duration_s = max(float(load["duration_s"]), count / rate)
        return np.asarray(
            arrivals_for(doc["arrival"], rate, duration_s, int(load["seed"]), trace, count)
        )

    return arrivals_at


def rounds_of(doc: Mapping[str, Any]) -> dict[str, dict[float, list[float]]]:
    """An --interleave document's on-time ratio of every round, by server and rate."""
    return {
        s: {float(r): [x["on_time_ratio"] or 0.0 for x in v] for r, v in per.items()}
        for s, per in doc["runs"].items()
    }


def pool_interleaved(docs: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Several --interleave documents of one model, deadline and arrival process as one: every
    round of every rate kept, the means over them, the bounds' means. Raises ValueError naming
    the first document that measured something else."""
    first = docs[0]
    cell = ("model", "deadline_ms", "arrival")
    for doc, name in zip(docs, names, strict=True):
        if any(doc.get(k) != first.get(k) for k in cell):
            raise ValueError(
                f"{name}: measured {doc.get('model')} at {doc.get('deadline_ms'):g} ms under "
                f"{doc.get('arrival')} arrivals, expected the first file's {first.get('model')} at "
                f"{first.get('deadline_ms'):g} ms under {first.get('arrival')}"
            )
    if len(docs) == 1:
        return dict(first)
    runs: dict[str, dict[str, list[Any]]] = {}
    for doc in docs:
        for server, per in doc["runs"].items():
            for rate, rounds in per.items():
                runs.setdefault(server, {}).setdefault(rate, []).extend(rounds)
    bounds = [d["compute_bound"] for d in docs]
    return {
        **first,
        "rounds": "/".join(str(r) for r in dict.fromkeys(d["rounds"] for d in docs)),
        "pooled_runs": len(docs),
        "runs": runs,
        "mean_on_time": mean_on_time(runs),
        "compute_bound": {  # each run's own, and their means (the speed warnings are per run)
            "runs": bounds,
            "rps": round(float(np.mean([b["rps"] for b in bounds])), 2),
            "batched_rps": round(float(np.mean([b["batched_rps"] for b in bounds])), 2)
            if all(b.get("batched_rps") for b in bounds)
            else None,
        },
    }


def load_interleaved(path: Path) -> dict[str, Any]:
    """A saved --interleave document. Raises ValueError naming `path` when it cannot be read or
    is not one."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: expected an --interleave JSON file ({exc})") from None
    if not isinstance(doc, dict) or "runs" not in doc or "mean_on_time" not in doc:
        raise ValueError(f"{path}: expected an --interleave JSON file (no runs by rate)")
    return doc


def report_main(paths: Sequence[Path], png: Path, seed: int) -> None:
    """`--report`: the runs in `paths` pooled, reported as after an --interleave run."""
    try:
        docs = [load_interleaved(path) for path in paths]
        doc = pool_interleaved(docs, [str(p) for p in paths])
    except ValueError as exc:
        raise SystemExit(f"--report: {exc}") from None
    print(f"{doc['model']}, {doc['deadline_ms']:g} ms, {doc.get('arrival', 'poisson')}: "
          f"{', '.join(p.name for p in paths)}")  # fmt: skip
    for path, one in zip(paths, docs, strict=True):
        warning = speed_warning(one["compute_bound"]) if len(docs) > 1 else None
        if warning:
            print(f"{path.name}: {warning}")
    ceilings = [d["compute_bound"].get("batched_rps") or 0.0 for d in docs]
    if min(ceilings) > 0 and max(ceilings) / min(ceilings) > 1.0 + SPEED_CHANGE_WARN:
        print(
            f"warning: these runs' batched ceilings differ ({min(ceilings):.1f} to "
            f"{max(ceilings):.1f} req/s): pooled, their rounds mix machine speeds, so read each "
            "run on its own as well"
        )
    report_interleaved(doc, png, np.random.default_rng(seed))
    print(f"wrote {png}")


def rounds_text(doc: Mapping[str, Any]) -> str:
    """How many rounds a result holds, in words: "2 rounds interleaved", or for runs pooled by
    `--report`, "5 runs pooled"."""
    runs = doc.get("pooled_runs", 1)
    if runs > 1:
        return f"{runs} runs pooled"
    return f"{doc['rounds']} rounds interleaved"


def crossings(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each server's crossing of the threshold, or its capacity where no crossing was bracketed."""
    return {r["server"]: r["crossing_rps"] or r["capacity_rps"] for r in rows}


def capacity_text(row: Mapping[str, Any]) -> str:
    """Where a server's on-time ratio crosses the threshold, in words: the crossing, else its
    capacity; "below R" when it is under the threshold already at the lowest rate measured, "R
    or more" when it never falls under it."""
    if row.get("crossing_rps"):
        return f"{round(row['crossing_rps'], 1):g}"
    rates = sorted(float(r) for r in row.get("runs", {}))
    capacity = float(row["capacity_rps"])
    if rates and capacity < rates[0]:
        return f"below {rates[0]:g}"
    if rates and capacity >= rates[-1]:
        return f"{capacity:g} or more"
    return f"{round(capacity, 1):g}"


def interleaved_results(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """An --interleave document as `plot`'s results: per server, the mean on-time ratio over
    the rounds at each rate, and as `capacity_rps` and `crossing_rps` the two of
    `threshold_crossing` over those means."""
    out = []
    for server, per in doc["mean_on_time"].items():
        capacity, crossing = threshold_crossing({float(r): v for r, v in per.items()})
        label = doc["knobs"][server] + (", folded" if doc.get("fold_peers") else "")
        out.append(
            {
                "server": server,
                "model": doc["model"],
                "deadline_ms": doc["deadline_ms"],
                "arrival": f"{doc.get('arrival', 'poisson')}, {rounds_text(doc)}",
                "knobs": label if server != "layerbatch" else doc["knobs"][server],
                "capacity_rps": capacity,
                "crossing_rps": crossing,
                "runs": {r: {"on_time_ratio": v} for r, v in per.items()},
            }
        )
    return out


# ----------------------------------------------------------------------------- output


def plot(
    results: Sequence[dict[str, Any]],
    bounds: Mapping[str, float],
    path: Path,
    ceilings: Mapping[str, float] | None = None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r["model"], r["deadline_ms"], r["arrival"]) for r in results))
    cols = min(len(panels), 3)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    colors = {"layerbatch": "C3", "triton": "C0", "ray": "C2", "torchserve": "C1"}
    for ax, (model, deadline, arrival) in zip(axes.flat, panels, strict=False):
        highest = 0.0
        for r in results:
            if (r["model"], r["deadline_ms"], r["arrival"]) != (model, deadline, arrival):
                continue
            runs = {**r.get("tuning_runs_at_these_knobs", {}), **r["runs"]}
            pts = sorted((float(k), v["on_time_ratio"] or 0.0) for k, v in runs.items())
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            highest = max(highest, *xs)
            ax.plot(
                xs,
                ys,
                "o-",
                color=colors.get(r["server"]),
                label=f"{r['server']} ({r['knobs']}): {capacity_text(r)}",
            )
        lines = (
            ("compute bound", bounds.get(model), {"color": "grey", "ls": ":"}),
            (
                "batched ceiling",
                (ceilings or {}).get(model),
                {"color": "black", "ls": "-.", "lw": 0.8},
            ),
        )
        for name, rate, style in lines:
            if rate and rate <= 3.0 * highest:
                ax.axvline(rate, label=name, **style)
            elif rate:  # far right of every rate measured (the Azure trace): named, not drawn
                ax.plot([], [], " ", label=f"{name} {rate:.0f} req/s, off the axis")
        ax.axhline(THRESHOLD, color="grey", ls="--", lw=0.8)
        ax.set_title(f"{model}, {deadline:g} ms, {arrival}")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("on-time ratio")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7, loc="lower left")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="resnet18, 300 ms, short, 2x2x2 grid")
    ap.add_argument("--models")
    ap.add_argument("--deadlines", help="ms, comma list")
    ap.add_argument("--servers", default=",".join(SERVERS))
    ap.add_argument("--arrivals", default="poisson,azure")
    ap.add_argument("--batches", help="max batch sizes tried for each peer")
    ap.add_argument("--delays", help="max batch delays (ms) tried for each peer")
    ap.add_argument(
        "--workers",
        default="1,2",
        help=f"worker counts tried for each peer, each worker with {THREADS} / workers torch "
        "threads (default 1,2)",
    )
    ap.add_argument(
        "--layerbatch-replicas",
        default="1,2",
        help=f"layerbatch's --replicas tried, each replica with {THREADS} / replicas torch threads "
        "(default 1,2); --interleave takes its best on record, else the most of these",
    )
    ap.add_argument(
        "--settle-pairs",
        type=int,
        default=SETTLE_PAIRS,
        help="after tuning, each server's best knobs against its second best in this many pairs "
        f"on the same arrivals, the better kept (default {SETTLE_PAIRS}; 0: the best capacity "
        "stands)",
    )
    ap.add_argument("--duration", type=float, help="seconds per measured rate")
    ap.add_argument("--tune-duration", type=float, help="seconds per rate while tuning")
    ap.add_argument("--min-requests", type=int, help="at least this many requests per rate")
    ap.add_argument("--tol", type=float, help="final search: stop when hi/lo <= 1 + tol")
    ap.add_argument("--seed", type=int, default=int(FULL_LOAD["seed"]))
    ap.add_argument("--policy", default="dp-tardy", help="layerbatch's policy")
    ap.add_argument(
        "--step-log",
        action="store_true",
        help="layerbatch writes every step it runs beside its log (LOGDIR/*.steps.jsonl), for "
        "bench/step_replay.py",
    )
    ap.add_argument("--out", help="JSON path (the PNG is beside it)")
    ap.add_argument(
        "--profile",
        type=float,
        default=0.0,
        help="instead of the benchmark: py-spy layerbatch's server for this many seconds under "
        "Poisson load at --profile-rate (first model, first deadline)",
    )
    ap.add_argument("--profile-rate", type=float, help="req/s (default: layerbatch's capacity)")
    ap.add_argument(
        "--interleave",
        help="instead of the benchmark: these rates (comma list), every server (--servers) up at "
        "once with its best knobs on record, measured in turn per rate (first model, deadline, "
        "arrivals)",
    )
    ap.add_argument("--rounds", type=int, default=2, help="--interleave: rounds over the rates")
    ap.add_argument(
        "--report",
        help="instead of the benchmark: report --interleave JSON files (comma list) of one model, "
        "deadline and arrival process, their rounds pooled, with layerbatch / best peer and its "
        "interval over the rounds; the plot goes to --out's PNG (default out/peers-report.png)",
    )
    ap.add_argument(
        "--pause-idle",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="--interleave: stop (SIGSTOP) the idle servers while another is measured, so that "
        "none pays for another's background work (Ray Serve's is 8-30%% of a core)",
    )
    ap.add_argument(
        "--fold-peers",
        action="store_true",
        help="the peers also serve the model with batch norms folded into the convolutions "
        "(as layerbatch's loader does by default)",
    )
    a = ap.parse_args(argv)
    q = a.quick
    grid = tuning_grid(
        [int(x) for x in (a.batches or ("4,8" if q else "1,4,8,16")).split(",")],
        [float(x) for x in (a.delays or ("5,20" if q else "1,5,20")).split(",")],
        [int(x) for x in a.workers.split(",")],
    )
    replicas = tuple(sorted({int(x) for x in a.layerbatch_replicas.split(",")}))
    if a.settle_pairs < 0:
        raise SystemExit(f"--settle-pairs: expected 0 or more, got {a.settle_pairs}")
    for w in [*(k.workers for k in grid), *replicas]:
        if not 1 <= w <= THREADS:
            raise SystemExit(f"--workers, --layerbatch-replicas: expected 1 to {THREADS}, got {w}")
    if a.report:
        a.out = a.out or "out/peers-report.json"
    out = Path(a.out or f"bench/results/{'peers-quick' if q else 'peers'}.json")
    return Settings(
        models=(a.models or ("resnet18" if q else ",".join(MODELS))).split(","),
        deadlines=[float(x) for x in (a.deadlines or ("300" if q else "300,1000")).split(",")],
        servers=[s for s in a.servers.split(",") if s],
        arrivals=a.arrivals.split(","),
        grid=grid,
        duration_s=a.duration or (12.0 if q else FULL_LOAD["duration_s"]),
        tune_duration_s=a.tune_duration or (8.0 if q else 10.0),
        min_requests=a.min_requests or (80 if q else int(FULL_LOAD["min_requests"])),
        tol=a.tol or (0.1 if q else 0.05),
        tune_tol=0.15,
        seed=a.seed,
        policy=a.policy,
        step_log=a.step_log,
        settle_pairs=a.settle_pairs,
        out=out if out.is_absolute() else ROOT / out,
        logdir=ROOT / "out" / "peers",
        profile_s=a.profile,
        profile_rate=a.profile_rate,
        interleave=[float(x) for x in a.interleave.split(",")] if a.interleave else [],
        rounds=a.rounds,
        fold_peers=a.fold_peers,
        layerbatch_replicas=replicas,
        pause_idle=a.pause_idle,
        report=[Path(x) for x in a.report.split(",") if x] if a.report else [],
    )


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> None:
    st = parse_args(argv)
    if st.report:
        report_main(st.report, st.out.with_suffix(".png"), st.seed)
        return
    for s in st.servers:
        if s not in SERVERS:
            raise SystemExit(f"--servers: expected some of {', '.join(SERVERS)}, got {s!r}")
    from client.frames import jpeg, video_frames
    from traces.arrivals import load_timestamps

    frames = [jpeg(f) for f in video_frames(limit=40, every=10)]
    trace = load_timestamps(AZURE_TRACE)
    st.logdir.mkdir(parents=True, exist_ok=True)
    st.out.parent.mkdir(parents=True, exist_ok=True)  # now, not after hours of runs
    if st.profile_s > 0:
        profile_main(st, frames)
        return
    if st.interleave:
        interleaved_main(st, frames, trace, st.interleave, st.rounds)
        return
    bench = Bench(st, frames, trace)
    t0 = time.monotonic()
    print(
        f"servers {', '.join(st.servers)}; models {', '.join(st.models)}; deadlines "
        f"{', '.join(f'{d:g}' for d in st.deadlines)} ms; arrivals {', '.join(st.arrivals)}; "
        f"peer grid {', '.join(k.label for k in st.grid)}",
        flush=True,
    )
    for model in st.models:
        asyncio.run(bench.model(model))
    bounds = {m: float(b["rps"]) for m, b in bench.bounds.items()}
    ceilings = {m: float(b["batched_rps"]) for m, b in bench.bounds.items()}
    rows = table_rows(bench.results, bounds, ceilings)
    text = format_table(rows, st.servers)
    print(text)
    doc = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "elapsed_s": round(time.monotonic() - t0),
        "settings": {
            **{k: v for k, v in asdict(st).items() if k not in ("grid", "out", "logdir")},
            "grid": [k.label for k in st.grid],
            "threads": THREADS,
            "threshold": THRESHOLD,
        },
        "compute_bound": bench.bounds,
        "table": rows,
        "checks": bench.checks,
        "results": bench.results,
        "tuning": bench.tuning,
        "settled": bench.settled,
    }
    st.out.write_text(json.dumps(doc, indent=1, default=str))
    plot(bench.results, bounds, st.out.with_suffix(".png"), ceilings)
    print(f"wrote {st.out} and {st.out.with_suffix('.png')} in {doc['elapsed_s']} s")


def profile_main(st: Settings, frames: list[bytes]) -> None:
    model, deadline = st.models[0], st.deadlines[0]
    rate = st.profile_rate
    if rate is None:
        found = [
            r["capacity_rps"]
            for _, r in tuning_records(st.out, model)
            if (r["server"], r["deadline_ms"]) == ("layerbatch", deadline)
        ]
        if not found:
            raise SystemExit("--profile: give --profile-rate (no layerbatch capacity on record)")
        rate = float(found[0])
    doc = asyncio.run(profile_layerbatch(st, frames, model, rate, st.profile_s, deadline))
    path = st.out.with_name("peers-profile.json")
    path.write_text(json.dumps(doc, indent=1, default=str))
    for mode in ("cpu", "idle"):
        d = doc[mode]
        print(f"[{mode}] {d['samples']} samples; load {d['load']}")
        for t, cats in d["categories"].items():
            n = d["threads"][t]
            print(f"  {t}: {n} samples")
            for c, k in cats.items():
                print(f"    {100.0 * k / n:5.1f}%  {c}")
        print("  top self frames:")
        for f, k in list(d["top_self"].items())[:15]:
            print(f"    {100.0 * k / max(d['samples'], 1):5.1f}%  {f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    # SIGTERM as Ctrl-C: KeyboardInterrupt, on which asyncio.run cancels the run, whose cleanup
    # stops every server it started (a plain SIGTERM left Ray Serve's 12 processes running, one
    # at 28% of a core; SIGINT itself is ignored in a job a script starts with &)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        main()
    except KeyboardInterrupt:
        raise SystemExit(
            "bench/peers.py: interrupted; the servers it started are stopped"
        ) from None

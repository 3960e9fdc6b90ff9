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
trace's first --min-requests arrivals rescaled to the rate), the capacity is where its on-time
ratio falls under 0.9. Tuning finds it by a search on the rate (grow/shrink by 1.5x from 0.8x the
best capacity found so far, else from the compute bound, then bisection to a tolerance). The
capacities reported are then measured in interleaved rounds (bench/peers_final.py,
--final-rounds, default 2): per case every server up at once at its pick, each measured in turn
on the same arrivals at 4-6 rates around the tuned capacities (further out for a server that
does not cross 0.9 between them), its capacity the crossing of its mean on-time ratio over the
rounds, and layerbatch / best peer with its interval over the rounds, as --interleave runs
measure them; --final-rounds 0 searches each server's capacity at its pick instead, one server
after another (on a drifting machine those compare servers at different speeds). Each peer's
knobs are tuned over a stated grid (workers x max batch x max delay; the best by capacity, then by
on-time ratio at the rate above it; then that best and the second best serve the same arrivals
at the best's capacity in --settle-pairs pairs, and the one with more on time is kept: one search
each is noisy; once one knob has a capacity, each later one is first run at the best so far and
searched only if on time there, else recorded as below it, ranked after those searched by its
on-time ratio there: --no-screen searches them all; knobs best in tuning runs on record beside
--out are tried first, which saves time only), at each deadline under each arrival process, and
its best there is the one reported; Triton also rejects a request that has queued longer than
the deadline (its queue policy), and Ray Serve takes up to 256 requests at once per replica
(`max_ongoing_requests`), both of which only help them. A server that dies in a search's run
(Triton's Python backend segfaulted once under load in over a hundred runs) is said, started again
with the same knobs, warmed up, and measured at that rate again; where it dies again, that run is
its result there, marked "server_exited". Settling pairs and --interleave rounds also start a
dead server again before measuring it. layerbatch runs its defaults: dp-tardy,
batch norms folded into the convolutions at load (`layerbatch serve --no-fold-bn` turns it off),
1x1 convolutions run on oneDNN at every batch size (layerexec/pointwise.py; `--fold-peers` hands
the peers the model prepared both ways, to see how much of the difference that is),
and each replica decoding its inputs on a thread of its own (the peers decode inside their batch
handlers, in turn with the forward). With `--layerbatch-replicas 1` it runs as one runtime whose 2
torch threads take both cores, and decodes on its executor thread between steps.

The compute bound is the highest rate a plain batch-1 decode + forward can sustain on 2 threads:
1000 / (decode_ms + forward_ms), medians over the frames, the faster memory layout; it is measured
before and after each model's servers (the machine is shared: both are reported, the mean used).
Beside it the batched ceiling: the same with full batches of 8 or 16, 1000 B / (B decode_ms +
forward_ms(B)), the best of those and of the model with its batch norms folded (as layerbatch
runs it), or, if more, what two lanes of one thread each serve in full batches of 16 with their
own decodes (`lanes_rps`, bench/lane_ceiling.py; measured since 2026-11-30: a lane's decodes
leave no core idle, up to 1.12x one runtime's ceiling here, though not in every run): about the
most any server could serve here, batching per model or per layer, with the cores to itself
(larger batches gain little more). Under the trace the rate is a mean and the bursts run far
above it, so each report also gives the crossing of an ideal server at the
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
out/peers/. Until then it keeps everything measured in peers.partial.json beside it, written after
each search, settling, final round and bound; `--resume` continues an interrupted run from there
(given the same flags), and a new run refuses to start over it. This file is the command line;
the parts live beside it, each named for what it holds:

    peers_settings.py  what a run measures          peers_knobs.py     knobs, grid, knobs on record
    peers_arrivals.py  Poisson and trace arrivals   peers_capacity.py  rate search, bounds
    peers_servers.py   server commands, processes   peers_load.py      load generator, protocols
    peers_tuning.py    the full benchmark (Bench)   peers_interleave.py  --interleave
    peers_final.py     its final rounds, the rounds --interleave runs too
    peers_report.py    --report, pooled runs        peers_profile.py   --profile (py-spy)
    peers_table.py     table and plot               peers_crossing.py, peers_ideal.py, peers_busy.py

They are tested in tests/test_peers_bench.py and beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: the repository root, for `bench.peers_*`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.peers_arrivals import AZURE_TRACE, FULL_LOAD, ROOT
from bench.peers_final import final_interval
from bench.peers_interleave import interleaved_main
from bench.peers_knobs import THREADS, tuning_grid
from bench.peers_profile import profile_main
from bench.peers_report import report_main
from bench.peers_servers import SERVERS
from bench.peers_settings import FINAL_ROUNDS, MODELS, SETTLE_PAIRS, Settings
from bench.peers_table import format_table, plot, table_rows
from bench.peers_tuning import Bench, checkpoint_path, write_json


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
    ap.add_argument(
        "--screen",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="tuning: a knob is first run at the best capacity its server's knobs reached so far "
        "in the case and searched only if on time there, else recorded as below it (it cannot "
        "be the best); --no-screen searches every knob's capacity",
    )
    ap.add_argument(
        "--final-rounds",
        type=int,
        default=FINAL_ROUNDS,
        help="the capacities: once every server is tuned on a model, all of them up at once at "
        "their picks, measured in turn at rates around the tuned capacities this many rounds, "
        "each capacity where its mean on-time ratio crosses 0.9 (default "
        f"{FINAL_ROUNDS}; 0: each server's capacity searched on its own, one after another)",
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
    ap.add_argument(
        "--out",
        help="JSON path (the PNG is beside it); until it is written, the full benchmark keeps "
        "what it has measured beside it, in NAME.partial.json",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="continue the unfinished run in --out's NAME.partial.json, given the flags it was "
        "started with: what it measured is kept and only the rest is measured",
    )
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
    if a.final_rounds < 0:
        raise SystemExit(f"--final-rounds: expected 0 or more, got {a.final_rounds}")
    for w in [*(k.workers for k in grid), *replicas]:
        if not 1 <= w <= THREADS:
            raise SystemExit(f"--workers, --layerbatch-replicas: expected 1 to {THREADS}, got {w}")
    if a.resume and (a.report or a.interleave or a.profile):
        raise SystemExit("--resume: continues a full benchmark run, not --report, --interleave "
                         "or --profile")  # fmt: skip
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
        resume=a.resume,
        screen=a.screen,
        final_rounds=a.final_rounds,
    )


def resume(bench: Bench, st: Settings) -> None:
    """With --resume, `bench` takes up the unfinished run saved at its checkpoint; without,
    that run is not overwritten (SystemExit saying so)."""
    path = checkpoint_path(st.out)
    if not path.exists():
        if st.resume:
            print(f"--resume: no unfinished run at {path}; starting from the beginning", flush=True)
        return
    if not st.resume:
        raise SystemExit(
            f"{path} holds an unfinished run: --resume continues it (with the flags it was "
            "started with); to start over, delete it"
        )
    try:
        bench.resume(json.loads(path.read_text()), str(path))
    except (OSError, json.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
        raise SystemExit(f"--resume: {path}: expected a bench/peers.py run ({exc!r})") from None
    except ValueError as exc:
        raise SystemExit(f"--resume: {exc}") from None
    print(
        f"--resume: {len(bench.tuning)} tuning searches, {len(bench.settled)} settlings and "
        f"{len(bench.results)} capacities on record in {path}",
        flush=True,
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
    bench = Bench(st, frames, trace, checkpoint_path(st.out))
    resume(bench, st)
    print(
        f"servers {', '.join(st.servers)}; models {', '.join(st.models)}; deadlines "
        f"{', '.join(f'{d:g}' for d in st.deadlines)} ms; arrivals {', '.join(st.arrivals)}; "
        f"peer grid {', '.join(k.label for k in st.grid)}",
        flush=True,
    )
    try:
        for model in st.models:
            asyncio.run(bench.model(model))
    except KeyboardInterrupt:
        print(
            f"what was measured is in {bench.checkpoint}; the same command with --resume "
            "continues it",
            flush=True,
        )
        raise
    bounds = {m: float(b["rps"]) for m, b in bench.bounds.items()}
    ceilings = {m: float(b["batched_rps"]) for m, b in bench.bounds.items()}
    rows = table_rows(bench.results, bounds, ceilings)
    text = format_table(rows, st.servers)
    print(text)
    rng = np.random.default_rng(st.seed)
    for row in rows:
        interval = final_interval(bench.finals, row, rng)
        if interval is not None:
            row["layerbatch_over_best_peer_interval"] = dataclasses.asdict(interval)
            print(f"{row['model']}, {row['deadline_ms']:g} ms, {row['arrival']}: layerbatch / "
                  f"best peer {interval.text()}")  # fmt: skip
    doc = {**bench.document(), "table": rows}
    write_json(st.out, doc)
    checkpoint_path(st.out).unlink(missing_ok=True)
    plot(bench.results, bounds, st.out.with_suffix(".png"), ceilings)
    print(f"wrote {st.out} and {st.out.with_suffix('.png')} in {doc['elapsed_s']} s")


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

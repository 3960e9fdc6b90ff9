"""layerbatch's server at this checkout against itself at another git revision, side by side.

A change to the server is worth keeping when it serves more requests on time under the same load
on the same machine; on these shared machines a server's on-time ratio moves by several points
from one run to the next, so one run before and one after say little. This starts both servers
at once (the revision checked out into a temporary git worktree, run with this checkout's venv),
stops (SIGSTOP) the one not being measured (`measure_alone`, as `bench/peers.py` measures every
server), and alternates them over `--pairs` pairs of `--seconds` of Poisson arrivals (the same
arrivals for both within a pair, the first of each pair alternating), as `bench/peers.py` sends
them; with `--arrivals azure`, every run sends the Azure code trace's first `--requests` arrivals
rescaled to the rate, as `bench/peers.py --arrivals azure` does. It prints each run's on-time
ratio, drops, timeouts and where the server's time went (`bench/peers_busy.py`: steps, decodes,
hand-offs, planning), then both sides' means and their difference.

`--against HEAD` measures the harness itself (an A/A run): the same code on both sides. On a
2-core machine, mobilenet_v2 at 300 ms and 125 req/s, single pairs differed by up to 0.05 and
three pairs' means by 0.003 (`bench/results/peers-log.md`, session 37). `--policy` and
`--against-policy` set each side's `--policy`: `--against HEAD --policy dynamic --against-policy
dp-tardy` measures one policy against another on the same code.

    .venv/bin/python bench/server_ab.py --against fb54789 --model mobilenet_v2 \\
        --deadline-ms 1000 --rate 150 --pairs 3
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: the repository root, for `bench.peers`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.peers_arrivals import AZURE_TRACE, FULL_LOAD, ROOT, arrivals_for, poisson_arrivals_s
from bench.peers_knobs import Knobs
from bench.peers_load import Load, measure_alone
from bench.peers_servers import Running
from client.frames import jpeg, video_frames
from scheduler.policies import POLICIES


@contextmanager
def worktree(rev: str, into: Path) -> Iterator[Path]:
    """`rev` checked out (detached) at `into` while the block runs, removed after; raises with
    git's own message if it cannot be checked out."""
    done = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(into), rev],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"--against: git could not check out {rev!r}: {done.stderr.strip()}")
    try:
        yield into
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(into)])


async def measure(args: argparse.Namespace, other: Path) -> dict[str, list[dict[str, Any]]]:
    from traces.arrivals import load_timestamps

    frames = [jpeg(f) for f in video_frames(limit=40, every=10)]
    trace = load_timestamps(AZURE_TRACE) if args.arrivals == "azure" else np.empty(0)
    logs = Path(args.logdir)
    # (name, checkout, replicas, policy); a git revision has no spaces
    sides = [
        ("this checkout", ROOT, args.replicas, args.policy),
        (args.against, other, args.against_replicas, args.against_policy),
    ]
    if args.policy != args.against_policy:
        sides = [(f"{n} ({p})", r, k, p) for n, r, k, p in sides]
    runs = {n: Running("layerbatch", args.model, Knobs(workers=k), args.deadline_ms, logs, p,
                       step_log=args.step_log, root=r)
            for n, r, k, p in sides}  # fmt: skip
    loads = {n: Load(r, frames, args.deadline_ms) for n, r in runs.items()}
    give_up_s = args.deadline_ms / 1000.0
    out: dict[str, list[dict[str, Any]]] = {n: [] for n in runs}
    try:
        for name, load in loads.items():  # ready, and a short warm-up at 70% of the rate
            await load.ready()
            warm = poisson_arrivals_s(0.7 * args.rate, 5.0, np.random.default_rng(args.seed))
            await load.run_arrivals(warm, give_up_s)
            print(f"{name}: ready in {runs[name].ready_s:.0f} s, its log {runs[name].log}",
                  file=sys.stderr, flush=True)  # fmt: skip
        for i in range(args.pairs):
            order = list(runs) if i % 2 == 0 else list(runs)[::-1]
            arrivals = arrivals_for(
                args.arrivals, args.rate, args.seconds, args.seed + 1 + i, trace, args.requests
            )
            duration_s = float(arrivals[-1]) if args.arrivals == "azure" else args.seconds
            for name in order:
                others = {n: x for n, x in loads.items() if n != name}
                row = await measure_alone(
                    loads[name], others, arrivals, duration_s, args.deadline_ms
                )
                out[name].append(row)
                shares = " ".join(f"{k} {v:.3f}" for k, v in row.get("busy_share", {}).items())
                print(
                    f"pair {i} {name:>10}: on time {row['on_time_ratio']:.3f}, dropped "
                    f"{row['dropped']}, timeouts {row['timeouts']}; {shares}",
                    flush=True,
                )
    finally:
        for load in loads.values():
            await load.close()
        for run in runs.values():
            run.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", required=True, help="a git revision (HEAD: an A/A run)")
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--deadline-ms", type=float, default=300.0)
    ap.add_argument("--rate", type=float, default=125.0, help="req/s (the mean, for the trace)")
    ap.add_argument("--arrivals", choices=("poisson", "azure"), default="poisson")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="this checkout's --replicas, each with 2 / replicas torch threads (bench/peers.py "
        "tunes it over 1 and 2)",
    )
    ap.add_argument(
        "--against-replicas",
        type=int,
        help="the revision's --replicas (default: --replicas; a revision from before --replicas "
        "existed takes only 1); `--against HEAD --replicas 2 --against-replicas 1` measures "
        "replicas against one runtime",
    )
    ap.add_argument(
        "--policy", choices=POLICIES, default="dp-tardy", help="this checkout's --policy"
    )
    ap.add_argument(
        "--against-policy",
        choices=POLICIES,
        help="the revision's --policy (default: --policy); `--against HEAD --policy dynamic "
        "--against-policy dp-tardy` measures one policy against another on the same code",
    )
    ap.add_argument("--seconds", type=float, default=20.0, help="per run, Poisson")
    ap.add_argument(
        "--requests", type=int, default=FULL_LOAD["min_requests"], help="per run, the trace"
    )
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--logdir", default=str(ROOT / "out" / "server-ab"))
    ap.add_argument(
        "--step-log",
        action="store_true",
        help="each side writes its steps beside its log in --logdir, as .steps.jsonl "
        "(bench/step_ratio.py reads them)",
    )
    args = ap.parse_args()
    if args.against_replicas is None:
        args.against_replicas = args.replicas
    if args.against_policy is None:
        args.against_policy = args.policy
    for flag in (
        "--rate",
        "--pairs",
        "--seconds",
        "--requests",
        "--replicas",
        "--against-replicas",
    ):
        value = getattr(args, flag[2:].replace("-", "_"))
        if not value > 0:
            raise SystemExit(f"{flag}: expected a positive number, got {value:g}")
    with (
        tempfile.TemporaryDirectory(prefix="layerbatch-ab-") as tmp,
        worktree(args.against, Path(tmp) / "checkout") as other,
    ):
        out = asyncio.run(measure(args, other))
    means = {n: float(np.mean([r["on_time_ratio"] for r in rows])) for n, rows in out.items()}
    (this, that) = means
    runs = f"{args.seconds:g} s" if args.arrivals == "poisson" else f"{args.requests} arrivals"
    print(
        f"\n{args.model}, {args.deadline_ms:g} ms, {args.rate:g} req/s ({args.arrivals}), "
        f"{args.pairs} pairs of {runs}: on time {means[this]:.3f} ({this}) against {means[that]:.3f} "
        f"({that}), difference {means[this] - means[that]:+.3f}"
    )


if __name__ == "__main__":
    main()

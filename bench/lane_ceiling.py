"""The batched ceiling on two one-thread lanes against one runtime of two threads (issue 9).

`bench/peers.py`'s batched ceiling is what one process with 2 torch threads serves in full
batches (decodes plus forwards of the folded model, channels-last). layerbatch's replicas and
the peers' two workers run two lanes of one thread each instead, so if two lanes served full
batches faster, the ceiling would understate what those servers could reach. This measures both
side by side: each repetition starts two fresh interpreters in turn (alternating order), one
running one lane of 2 threads and one running two lanes of one thread at once, each lane
decoding `--batch` of the bundled video's JPEG frames and running them as one batch, over and
over for `--seconds`. Reported: samples a second of each, and the median of the
per-repetition ratios (two lanes / one runtime); about 1 means the ceiling holds for both.

    .venv/bin/python bench/lane_ceiling.py [--models mobilenet_v2,resnet18,googlenet]
        [--batch 16] [--seconds 8] [--reps 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("one runtime, 2 threads", "two lanes, 1 thread each")
LANES = {MODES[0]: (1, 2), MODES[1]: (2, 1)}  # lanes, torch threads each
# what bench/peers.py measures with each compute bound (`lanes_rps`)
LANE_BATCH, LANE_SECONDS = 16, 4.0
CHILD = """
import json, sys, threading, time
import torch
from bench.peers_model import Model
from client.frames import jpeg, video_frames
model, lanes, threads, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
seconds = float(sys.argv[5])
frames = [jpeg(f) for f in video_frames(limit=batch, every=10)]
ms = [
    Model(model, threads=threads, fold_batch_norm=True, own_thread=True, warm_batches=(batch,))
    for _ in range(lanes)
]
def serve(m):
    return m.forward(torch.stack([m.decode(j) for j in frames]))
for m in ms:
    serve(m)
done = [0] * lanes
stop = time.perf_counter() + seconds
def lane(i):  # at least one batch, however late the thread starts
    while True:
        serve(ms[i])
        done[i] += batch
        if time.perf_counter() >= stop:
            break
workers = [threading.Thread(target=lane, args=(i,)) for i in range(lanes)]
t0 = time.perf_counter()
for w in workers:
    w.start()
for w in workers:
    w.join()
print(json.dumps(sum(done) / (time.perf_counter() - t0)))
"""


def samples_per_s(model: str, lanes: int, threads: int, batch: int, seconds: float) -> float:
    """What `lanes` lanes of `threads` torch threads each serve of `model` (folded, as
    layerbatch runs it) in full batches of `batch`, each lane decoding its own frames, over
    about `seconds`, in a fresh interpreter (torch's thread count is per process)."""
    argv = [model, str(lanes), str(threads), str(batch), f"{seconds:g}"]
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *argv],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    return float(json.loads(out.stdout.splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--models", default="mobilenet_v2,resnet18,googlenet")
    ap.add_argument("--batch", type=int, default=LANE_BATCH)
    ap.add_argument("--seconds", type=float, default=2 * LANE_SECONDS)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    if a.batch < 1 or a.seconds <= 0 or a.reps < 1:
        raise SystemExit(
            f"--batch, --seconds, --reps: expected a positive batch, time and count, got "
            f"{a.batch}, {a.seconds:g}, {a.reps}"
        )
    for model in a.models.split(","):
        got: dict[str, list[float]] = {m: [] for m in MODES}
        for rep in range(a.reps):
            for mode in MODES if rep % 2 == 0 else MODES[::-1]:
                got[mode].append(samples_per_s(model, *LANES[mode], a.batch, a.seconds))
            print(f"{model} rep {rep}: " + ", ".join(f"{m} {got[m][-1]:.1f}/s" for m in MODES))
        ratio = statistics.median(t / o for o, t in zip(got[MODES[0]], got[MODES[1]], strict=True))
        print(
            f"{model} at batch {a.batch}: "
            + ", ".join(f"{m} {statistics.median(got[m]):.1f} samples/s" for m in MODES)
            + f"; two lanes / one runtime {ratio:.2f} (median of {a.reps})",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""Two one-thread lanes in one process beside a loop that holds the GIL, eager stages against
TorchScript stages (layerexec.script). Target: ratio (scripted / eager req/s) above 1 whenever
the loop holds the GIL part of the time, and about 1 when it does not: what scripting the
stages buys a replicated server (`layerbatch serve --replicas 2`) in a burst, where its event
loop parses and plans while both lanes run.

Side by side in one run: each repetition starts two fresh interpreters in turn (alternating
order). Each loads the model (batch norms folded, channels-last), scripts its stages or not, and
runs it at --batch on two threads of one torch thread each for --seconds, while a third thread
runs pure Python for --loop-duty of every 10 ms (the event loop's share of a burst; 0 for none).
Reported: requests a second through both lanes, and the median of the per-repetition ratios.

    .venv/bin/python bench/script_stages.py [--model resnet18] [--batch 1] [--loop-duty 0.5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import json, sys, threading, time
model, batch, duty, seconds, mode = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
import torch
from layerexec.script import script_stages
from layerexec.zoo import load_model
torch.set_num_threads(1)
sys.setswitchinterval(0.0005)  # as the server sets it (server/runtime.py)
m = load_model(model).to("cpu", channels_last=True)
if mode == "scripted":
    m = script_stages(m, channels_last=True)
def batch_of(n):
    return torch.rand(n, *m.spec.input_shape).contiguous(memory_format=torch.channels_last)
for n in (1, 2, batch):
    m.run(batch_of(n))
stop = time.perf_counter() + seconds
done = [0, 0]
def lane(i):
    x = batch_of(batch)
    while time.perf_counter() < stop:
        m.run(x)
        done[i] += batch
def loop():
    while time.perf_counter() < stop:
        t = time.perf_counter()
        while time.perf_counter() - t < 0.010 * duty:
            sum(i * i for i in range(200))
        time.sleep(0.010 * (1 - duty))
threads = [threading.Thread(target=lane, args=(i,)) for i in range(2)]
threads += [threading.Thread(target=loop)] if duty > 0 else []
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(sum(done) / seconds))
"""
MODES = ("eager", "scripted")


def child(model: str, batch: int, duty: float, seconds: float, mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model, str(batch), str(duty), str(seconds), mode],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    return float(json.loads(out.stdout.splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--loop-duty", type=float, default=0.5, help="share of the loop's GIL, 0-1")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    if not 0 <= a.loop_duty < 1:
        sys.exit(f"--loop-duty: expected a share from 0 up to (not including) 1, got {a.loop_duty}")
    got: dict[str, list[float]] = {m: [] for m in MODES}
    ratios = []
    for rep in range(a.reps):
        for mode in MODES if rep % 2 == 0 else MODES[::-1]:
            got[mode].append(child(a.model, a.batch, a.loop_duty, a.seconds, mode))
        ratios.append(got["scripted"][-1] / got["eager"][-1])
        print(f"rep {rep}: " + ", ".join(f"{m} {got[m][-1]:.1f} req/s" for m in MODES), flush=True)
    for m in MODES:
        print(f"{m:<9} {statistics.median(got[m]):6.1f} req/s (median of {a.reps})")
    print(f"ratio scripted / eager: {statistics.median(ratios):.2f} (median of {a.reps})")


if __name__ == "__main__":
    main()

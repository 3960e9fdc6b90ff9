"""Forwards on a worker thread, with and without torch work on a second thread of the process
(layerexec.torch_thread). Target: ratio (second team / one team) well above 1 on a machine whose
cores torch's threads fill; it is what building the server on its executor thread saves.

Side by side in one run: each repetition starts two fresh interpreters in turn (alternating
order), both limited to --cpus CPUs with as many torch threads; each loads the model, runs one
parallel op on its main thread or not, and times batches of --batch on a worker thread. Reported:
median ms per sample of each, the median of the per-repetition ratios, and the voluntary context
switches per forward (futex sleeps at the ops' barriers).

    .venv/bin/python bench/torch_thread.py [--model mobilenet_v2] [--batch 8] [--reps 5]
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
import json, os, resource, statistics, sys, threading, time
cpus, model, batch, mode = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cpus])
import torch
from layerexec.allocator import keep_freed_memory
from layerexec.torch_thread import TorchThread
from layerexec.zoo import load_model
keep_freed_memory()
torch.set_num_threads(cpus)
thread = TorchThread()
m = thread.call(load_model, model)
if mode == "second-team":
    torch.ones(2**22).add_(1)
def run():
    x = torch.rand(batch, *m.spec.input_shape).contiguous(memory_format=torch.channels_last)
    for _ in range(2):
        m.run(x)
    ms, cs = [], resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    for _ in range(8):
        t = time.perf_counter()
        m.run(x)
        ms.append((time.perf_counter() - t) * 1000 / batch)
    return statistics.median(ms), (resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - cs) / 8
print(json.dumps(thread.call(run)))
"""


def child(cpus: int, model: str, batch: int, mode: str) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(cpus), model, str(batch), mode],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    ms, switches = json.loads(out.stdout.splitlines()[-1])
    return float(ms), float(switches)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    modes = ("one-team", "second-team")
    got: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    ratios = []
    for rep in range(a.reps):
        for mode in modes if rep % 2 == 0 else modes[::-1]:
            got[mode].append(child(a.cpus, a.model, a.batch, mode))
        ratios.append(got["second-team"][-1][0] / got["one-team"][-1][0])
        print(f"rep {rep}: " + ", ".join(f"{m} {got[m][-1][0]:.2f} ms" for m in modes), flush=True)
    for m in modes:
        ms = statistics.median(g[0] for g in got[m])
        cs = statistics.median(g[1] for g in got[m])
        print(f"{m:<12} {ms:6.2f} ms a sample, {cs:6.1f} voluntary switches a forward")
    print(f"ratio second-team / one-team: {statistics.median(ratios):.2f} (median of {a.reps})")


if __name__ == "__main__":
    main()

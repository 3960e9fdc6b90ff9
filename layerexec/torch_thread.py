"""One thread for all of a process's torch work: loading the models, warming them up, every forward.

PyTorch's OpenMP runtime on Linux (libgomp) gives each thread that starts a parallel region a
team of worker threads of its own, and keeps that team for the rest of the thread's life. Once
the threads libgomp manages outnumber the CPUs, it stops spin-waiting at the end of a parallel
region and sleeps on a futex instead (its throttled spin count), so every parallel op of a
forward pays for waking its workers. Loading a model runs parallel ops (initialisation, layout
changes, folding), so a server that loads on its main thread and runs forwards on a worker
thread has two teams. Measured here (2 cores, 2 torch threads, mobilenet_v2 at batch 8 on a
worker thread, `bench/torch_thread.py`): 5.4 ms a sample when no other thread had run a parallel
op, 7.7 ms (and 127 voluntary context switches a forward instead of none) once the main thread
had run one; 6.3 against 13.0 ms in an earlier pair.
`tests/test_torch_thread.py` checks it in a fresh interpreter.

So whatever touches the models runs on one `TorchThread`; the other threads of the process keep
to small tensors (below torch's grain size nothing runs in parallel) or numpy.

When torch's threads take every core, any other thread that runs (a server's event loop: HTTP,
planning, answers) takes a core from one of them, and the other spins at the op's barrier until
it is back. `yield_to_torch` lowers the calling thread's priority (nice 5) so the kernel runs it
mostly in the gaps instead. Too low a priority costs more than it saves: the loop is where a
request comes in and its answer goes out, and a starved loop receives late, so the client's
deadline is nearer than the server counts. Measured here (mobilenet_v2, 300 ms deadline, 2
cores, Poisson load, runs alternating): from nice 0 to 10 the executor's step time a sample went
10.1 -> 9.4 ms, but the client's latency over the server's own went from 4 to 17-20 ms (median;
p99 15 -> 55-70) and requests timed out at the client that the server was still running. At 90
req/s, four pairs, nice 10 then 5: 0.665/0.966, 0.899/0.829, 0.513/0.603, 0.567/0.711 on time
(mean 0.661 -> 0.778), the lag 16-19 -> 10 ms; at 95 req/s nice 5 also beat nice 0, 3 and 7.
resnet18 at 34 req/s (a third of the requests, each longer): 0.876 -> 0.852 over three pairs,
within the rounds' spread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

LOOP_NICE = 5
P = ParamSpec("P")
T = TypeVar("T")


class TorchThread:
    """A single worker thread; `call` runs a function on it and returns (or raises) its result.
    `pool` is the thread as an executor, for `loop.run_in_executor`."""

    def __init__(self, name: str = "layerbatch-exec") -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self.pool.submit(int).result()  # started now: it inherits this thread's priority

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return self.pool.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def yield_to_torch(nice: int = LOOP_NICE) -> bool:
    """Lower the calling thread's scheduling priority to `nice` (Linux: per thread; threads it
    starts later inherit it, so start the torch thread first; without privileges it cannot be
    raised again). False where it is not supported."""
    if not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id"):
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except OSError:
        return False
    return True

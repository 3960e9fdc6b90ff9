"""layerexec.allocator: freed activation memory stays in the process (not faulted in again), and
the heap reserve serves a new largest block from touched memory.

Each case runs in a fresh interpreter, as the server does: the setting is process-wide and must
not leak into the test session. mobilenet_v2 runs batches of 8 on a worker thread (as the
server's executor thread does); the page faults of the later forwards count, their median: one
later forward may still grow the heap into fresh pages (seen once in a loaded test session, 3,528
faults in one forward), which is not the per-forward cost this setting removes.
"""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

SCRIPT = """
import resource, statistics, sys, threading
import torch
from layerexec.allocator import keep_freed_memory
from layerexec.zoo import load_model
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
torch.set_num_threads(2)
faults = []
def work():
    m = load_model("mobilenet_v2")
    x = torch.rand(8, 3, 224, 224)
    with torch.inference_mode():
        for i in range(6):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            m.module(x)
            if i >= 2:
                faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
t = threading.Thread(target=work)
t.start()
t.join()
print(applied, statistics.median_low(faults))
"""
GLIBC = platform.libc_ver()[0] == "glibc"


def _run(script: str, mode: str) -> tuple[bool, int]:
    """`script` in a fresh interpreter: (whether the setting applied, the faults it counted)."""
    out = subprocess.run(
        [sys.executable, "-c", script, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(not GLIBC, reason="a glibc setting")
def test_kept_memory_is_not_faulted_in_again_at_each_forward() -> None:
    applied, faults = _run(SCRIPT, "keep")
    assert applied and faults < 500


@pytest.mark.skipif(not GLIBC, reason="a glibc setting")
def test_without_it_each_forward_faults_its_large_activations_in_afresh() -> None:
    """The control: what the setting removes (tens of MB of activations, 4 KiB pages)."""
    applied, faults = _run(SCRIPT, "default")
    assert not applied and faults > 2000


RESERVE_SCRIPT = """
import resource, sys, threading
import torch
from layerexec.allocator import keep_freed_memory, reserve_heap
keep_freed_memory()
reserved = reserve_heap(256 << 20) if sys.argv[1] == "reserve" else False
faults = []
def work():  # on a worker thread, as the server's executor thread allocates
    small = [torch.empty(1000) for _ in range(100)]  # what a server keeps between its batches
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(48 << 20, dtype=torch.uint8).fill_(1)  # a batch's largest activation
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
t = threading.Thread(target=work)
t.start()
t.join()
print(reserved, faults[0])
"""


@pytest.mark.skipif(not GLIBC, reason="a glibc heap")
def test_a_block_within_the_reserve_is_served_from_touched_memory() -> None:
    reserved, faults = _run(RESERVE_SCRIPT, "reserve")
    assert reserved and faults < 500


@pytest.mark.skipif(not GLIBC, reason="a glibc heap")
def test_without_the_reserve_a_new_largest_block_grows_the_heap_into_fresh_pages() -> None:
    """The control: 48 MiB of fresh 4 KiB pages is about 12,000 faults."""
    reserved, faults = _run(RESERVE_SCRIPT, "none")
    assert not reserved and faults > 6000

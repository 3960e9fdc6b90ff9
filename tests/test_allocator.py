"""layerexec.allocator: freed activation memory stays in the process (not faulted in again).

Each case runs in a fresh interpreter, as the server does: the setting is process-wide and must
not leak into the test session. mobilenet_v2 runs batches of 8 on a worker thread (as the
server's executor thread does); the page faults of the later forwards count.
"""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

SCRIPT = """
import resource, sys, threading
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
        for i in range(4):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            m.module(x)
            if i >= 2:
                faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
t = threading.Thread(target=work)
t.start()
t.join()
print(applied, max(faults))
"""
GLIBC = platform.libc_ver()[0] == "glibc"


def _faults_per_forward(mode: str) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(not GLIBC, reason="a glibc setting")
def test_kept_memory_is_not_faulted_in_again_at_each_forward() -> None:
    applied, faults = _faults_per_forward("keep")
    assert applied and faults < 500


@pytest.mark.skipif(not GLIBC, reason="a glibc setting")
def test_without_it_each_forward_faults_its_large_activations_in_afresh() -> None:
    """The control: what the setting removes (tens of MB of activations, 4 KiB pages)."""
    applied, faults = _faults_per_forward("default")
    assert not applied and faults > 2000

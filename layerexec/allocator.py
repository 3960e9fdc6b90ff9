"""Keeping freed tensor memory in the process (glibc malloc) instead of handing it back.

glibc serves an allocation above its mmap threshold (dynamic, at most 32 MiB) with fresh pages
from the kernel and unmaps them when it is freed, and trims the heap's top once more than the
trim threshold is free. A batch whose activations exceed those sizes then faults its whole
footprint in again at every stage: on this project's 2-core machine (2 torch threads) a batch of
8 through mobilenet_v2 took 55.6 ms and one of 16 took 151 ms, against 44.2 and 91.5 ms with
freed memory kept (resnet18 and googlenet at 16: 10-12% faster; batch 1 about the same). This
is what the usual advice of serving PyTorch on CPUs with jemalloc or tcmalloc buys.
`keep_freed_memory` raises both thresholds for the calling process and puts every thread on
the one heap; memory once used for activations stays with it (the server's high-water mark)
rather than being returned. Kept memory is scattered, though: a block larger than every free one
(a burst's first batch larger than any before) still grows the heap into fresh pages, which
`reserve_heap` heads off by leaving touched room at the heap's top.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_TRIM_THRESHOLD = -1  # mallopt parameters (glibc's malloc.h)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
KEEP_BYTES = 1 << 30


def keep_freed_memory(threshold_bytes: int = KEEP_BYTES) -> bool:
    """Serve allocations below `threshold_bytes` from the heap, trim it only when more than
    that is free, and give every thread the one heap (a thread's own arena would still map
    large blocks afresh): glibc's mallopt. Returns whether it applied: False on a C library
    other than glibc, whose allocator this does not concern."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(
        libc.mallopt(M_MMAP_THRESHOLD, threshold_bytes)
        and libc.mallopt(M_TRIM_THRESHOLD, threshold_bytes)
        and libc.mallopt(M_ARENA_MAX, 1)
    )


def reserve_heap(nbytes: int) -> bool:
    """Leave `nbytes` of touched memory free at the heap's top: allocate them in one block,
    write every page, free it (it stays: `keep_freed_memory`'s trim threshold). An allocation
    that no free block of the heap can hold is carved from the top; without this reserve it
    grows the heap into fresh pages, and on a virtual machine whose host takes back guest memory
    a fresh page costs far more than its fault (measured on this project's VM: a 77 MB
    activation in fresh memory, 190 ms, about 3x the stage that writes it). Returns whether it
    applied (glibc, after `keep_freed_memory`)."""
    libc = _glibc()
    if nbytes <= 0 or libc is None:
        return False
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    block = libc.malloc(ctypes.c_size_t(nbytes))
    if not block:
        return False
    ctypes.memset(block, 1, nbytes)
    libc.free(block)
    return True


def _glibc() -> ctypes.CDLL | None:
    """The C library, if it is glibc (the allocator these settings concern)."""
    if platform.libc_ver()[0] != "glibc":
        return None
    path = ctypes.util.find_library("c")
    return None if path is None else ctypes.CDLL(path)

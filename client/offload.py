"""Where a frame runs: the client's offload decision (paper 003, section 4.4).

For a model of N stages, split position k means: the client runs stages [0, k) and the server
runs [k, N); k = 0 sends the frame (JPEG), k = N runs all locally. With

    L(k)  = local_wait_ms + sum(stage_ms[0:k])               (the device is one FIFO)
    T(k)  = uplink_wait_ms + bytes(k) / throughput            (bytes(0) = the JPEG)
    S(k)  = the server's estimate for a request entering at k (None: it would not serve it)
    R(k)  = L(k) + encode_ms(k) + T(k) + S(k)   for 0 < k < N
    R(0)  = encode_ms(0) + T(0) + S(0)   (a frame waits for no device: no L term)
    R(N)  = L(N)

- `none`: always k = 0 (server only).            - `local`: always k = N.
- `binary`: k = N if L(N) <= deadline, else the smaller of R(0) and R(N).
- `partial`: k = N if L(N) <= deadline, else the k in 0..N minimising R(k) (ties: the smaller
  k, less client work). Both modes offload a frame only when running it locally would miss
  its deadline (section 6.5), which keeps the server for the frames that need it.

The uplink estimate is an EWMA of delay per byte with weight 0.3 on each new sample (section 4.4). Everything
here is pure: estimates and times are passed in, nothing reads a clock or the network.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

MODES = ("none", "local", "binary", "partial")
Mode = Literal["none", "local", "binary", "partial"]
Kind = Literal["local", "full", "partial"]
EWMA_WEIGHT = 0.3


@dataclass
class ThroughputEstimate:
    """The uplink's delay per byte, EWMA: new = 0.3 x sample + 0.7 x old, with sample = the
    transfer's time / its bytes (section 4.4's EWMA on the network delay of a transmission size).
    Averaging delay, not rate, keeps a one-packet message that happened to catch a delivery
    opportunity at once from sending the estimate to a huge rate. Constructed from a rate."""

    prior_bytes_per_ms: float
    weight: float = EWMA_WEIGHT

    def __post_init__(self) -> None:
        self.ms_per_byte = 1.0 / self.prior_bytes_per_ms

    @property
    def bytes_per_ms(self) -> float:
        return 1.0 / self.ms_per_byte

    def update(self, nbytes: int, transfer_ms: float) -> None:
        """One finished transfer: `nbytes` took `transfer_ms` on the link (queueing excluded)."""
        if nbytes <= 0 or transfer_ms <= 0:
            return
        sample = transfer_ms / nbytes
        self.ms_per_byte = self.weight * sample + (1.0 - self.weight) * self.ms_per_byte

    def transfer_ms(self, nbytes: int) -> float:
        return nbytes * self.ms_per_byte


@dataclass(frozen=True)
class Costs:
    """What the client knows about one frame's options (see the module docstring)."""

    stage_ms: Sequence[float]  # local time of each stage on this device (slowdown included)
    encode_ms: Sequence[float]  # per k in 0..N-1: preparing the payload (k = 0: the JPEG)
    payload_bytes: Sequence[int]  # per k in 0..N-1: bytes sent (k = 0: the JPEG)
    server_ms: Sequence[float | None]  # per k in 0..N-1: the server's estimate
    local_wait_ms: float = 0.0
    uplink_wait_ms: float = 0.0

    @property
    def n_stages(self) -> int:
        return len(self.stage_ms)

    def local_ms(self, k: int) -> float:
        return self.local_wait_ms + sum(self.stage_ms[:k])

    def remote_ms(self, k: int, link: ThroughputEstimate) -> float:
        """R(k) for k < N; infinite when the server would not serve it."""
        server = self.server_ms[k]
        if server is None:
            return math.inf
        local = self.local_ms(k) if k > 0 else 0.0
        transmit = self.uplink_wait_ms + link.transfer_ms(self.payload_bytes[k])
        return local + self.encode_ms[k] + transmit + server


@dataclass(frozen=True)
class Decision:
    kind: Kind
    split: int  # stages [0, split) run on the client
    predicted_ms: float


def decide(mode: Mode, costs: Costs, link: ThroughputEstimate, deadline_ms: float) -> Decision:
    """The split for one frame under `mode` (module docstring)."""
    if mode not in MODES:
        raise ValueError(f"offload mode {mode!r}: expected one of {', '.join(MODES)}")
    n = costs.n_stages
    local = Decision("local", n, costs.local_ms(n))
    if mode == "local":
        return local
    if mode == "none":
        return Decision("full", 0, costs.remote_ms(0, link))
    if local.predicted_ms <= deadline_ms:
        return local
    if mode == "binary":
        remote = costs.remote_ms(0, link)
        return Decision("full", 0, remote) if remote < local.predicted_ms else local
    best = local  # partial
    for k in range(n - 1, -1, -1):  # downwards, so ties go to the smaller k
        r = costs.remote_ms(k, link)
        if r <= best.predicted_ms:
            best = Decision("full" if k == 0 else "partial", k, r)
    return best

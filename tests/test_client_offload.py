"""The client's offload decision (client/offload.py): pure functions of what the client knows.

The formulas are those of the module docstring (paper 003, section 4.4):

    L(k) = local_wait_ms + sum(stage_ms[0:k])
    T(k) = uplink_wait_ms + bytes(k) / throughput
    R(k) = L(k) + encode_ms(k) + T(k) + S(k)   for k < N,   R(N) = L(N)

Hand-computed cases use small numbers whose sums are exact in binary floating point, and the
property tests draw whole numbers and a power-of-two throughput, so that every R(k) is exact and
ties are real ties (the tie rule is part of the contract).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.offload import (
    EWMA_WEIGHT,
    MODES,
    Costs,
    Decision,
    Kind,
    ThroughputEstimate,
    decide,
)

# --- the docstring's formulas, written out independently of client/offload.py ------------------


def doc_local(c: Costs, k: int) -> float:
    """L(k) as the module docstring states it."""
    return c.local_wait_ms + sum(c.stage_ms[:k])


def doc_remote(c: Costs, k: int, bytes_per_ms: float) -> float:
    """R(k) for k < N as the module docstring states it, except that R(0) leaves out the
    device's queue: a full offload sends the camera's JPEG, which never waits for the device
    (see test_full_offload_prediction_per_docstring_includes_local_wait)."""
    server = c.server_ms[k]
    if server is None:
        return math.inf
    local = doc_local(c, k) if k > 0 else 0.0
    transmit = c.uplink_wait_ms + c.payload_bytes[k] / bytes_per_ms
    return local + c.encode_ms[k] + transmit + server


def doc_r(c: Costs, k: int, bytes_per_ms: float) -> float:
    """R(k) for k in 0..N (R(N) = L(N))."""
    return doc_local(c, k) if k == c.n_stages else doc_remote(c, k, bytes_per_ms)


def costs(
    stage_ms: list[float],
    server_ms: list[float | None],
    payload_bytes: list[int] | None = None,
    encode_ms: list[float] | None = None,
    local_wait_ms: float = 0.0,
    uplink_wait_ms: float = 0.0,
) -> Costs:
    n = len(stage_ms)
    return Costs(
        stage_ms,
        [0.0] * n if encode_ms is None else encode_ms,
        [0] * n if payload_bytes is None else payload_bytes,
        server_ms,
        local_wait_ms,
        uplink_wait_ms,
    )


# --- the throughput estimate ---------------------------------------------------------------------


def test_ewma_weight_is_0_3() -> None:
    assert EWMA_WEIGHT == 0.3
    assert ThroughputEstimate(1.0).weight == 0.3


def test_ewma_update_hand_computed() -> None:
    est = ThroughputEstimate(100.0)  # 0.01 ms per byte
    est.update(1000, 5.0)  # sample 0.005 ms per byte
    assert est.ms_per_byte == pytest.approx(0.3 * 0.005 + 0.7 * 0.01)  # 0.0085
    est.update(300, 10.0)  # sample 1/30 ms per byte
    assert est.ms_per_byte == pytest.approx(0.3 / 30 + 0.7 * 0.0085)
    assert est.bytes_per_ms == pytest.approx(1 / est.ms_per_byte)
    assert est.transfer_ms(2000) == pytest.approx(2000 * est.ms_per_byte)


@given(
    old=st.floats(0.001, 1e6),
    nbytes=st.integers(1, 10**8),
    transfer_ms=st.floats(0.001, 1e6),
)
def test_ewma_of_delay_per_byte_is_0_3_sample_plus_0_7_old(
    old: float, nbytes: int, transfer_ms: float
) -> None:
    est = ThroughputEstimate(old)
    est.update(nbytes, transfer_ms)
    expected = 0.3 * (transfer_ms / nbytes) + 0.7 / old
    assert est.ms_per_byte == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("nbytes", "transfer_ms"),
    [(0, 5.0), (-10, 5.0), (1000, 0.0), (1000, -1.0), (0, 0.0), (-1, -1.0)],
)
def test_ewma_ignores_empty_or_non_positive_samples(nbytes: int, transfer_ms: float) -> None:
    est = ThroughputEstimate(42.0)
    est.update(nbytes, transfer_ms)
    assert est.bytes_per_ms == pytest.approx(42.0)


# --- none and local --------------------------------------------------------------------------------

# a case where running locally is clearly best and one where the server is unknown
EASY_LOCAL = costs([1.0, 1.0, 1.0], [100.0, 100.0, 100.0], [1000, 500, 250])
SERVER_UNKNOWN = costs([50.0, 50.0, 50.0], [None, None, None], [1000, 500, 250])
SERVER_FAST = costs([50.0, 50.0, 50.0], [1.0, 1.0, 1.0], [1000, 500, 250])


@pytest.mark.parametrize("c", [EASY_LOCAL, SERVER_UNKNOWN, SERVER_FAST])
@pytest.mark.parametrize("deadline_ms", [0.5, 10.0, 1e6])
def test_none_always_sends_the_whole_frame(c: Costs, deadline_ms: float) -> None:
    d = decide("none", c, ThroughputEstimate(100.0), deadline_ms)
    assert (d.kind, d.split) == ("full", 0)
    assert d.predicted_ms == doc_remote(c, 0, 100.0)  # inf when the server would not serve


@pytest.mark.parametrize("c", [EASY_LOCAL, SERVER_UNKNOWN, SERVER_FAST])
@pytest.mark.parametrize("deadline_ms", [0.5, 10.0, 1e6])
def test_local_always_runs_every_stage(c: Costs, deadline_ms: float) -> None:
    d = decide("local", c, ThroughputEstimate(100.0), deadline_ms)
    assert d == Decision("local", c.n_stages, doc_local(c, c.n_stages))


def test_unknown_mode_is_refused_naming_the_modes() -> None:
    with pytest.raises(ValueError, match="offload mode 'cloud'") as info:
        decide("cloud", EASY_LOCAL, ThroughputEstimate(1.0), 10.0)  # type: ignore[arg-type]
    for mode in MODES:
        assert mode in str(info.value)


# --- binary ----------------------------------------------------------------------------------------

# N = 2 stages of 30 ms each (L(2) = 60 ms; with a 10 ms device queue, 70 ms); JPEG 2000 bytes
# at 100 bytes/ms: T(0) = 20 ms.
BINARY_CASES = [
    # local meets the deadline: local, whatever the server offers
    ("fits", [30.0, 30.0], [1.0, 1.0], 0.0, 60.0, ("local", 2, 60.0)),
    ("fits-exactly-with-queue", [30.0, 30.0], [1.0, 1.0], 10.0, 70.0, ("local", 2, 70.0)),
    # misses the deadline; R(0) = 0 + 0 + 20 + 5 = 25 < 60: the server
    ("server-faster", [30.0, 30.0], [5.0, 5.0], 0.0, 50.0, ("full", 0, 25.0)),
    # misses; R(0) = 20 + 50 = 70 > 60: local anyway (the smaller of the two)
    ("server-slower", [30.0, 30.0], [50.0, 50.0], 0.0, 50.0, ("local", 2, 60.0)),
    # misses; R(0) = 20 + 40 = 60 = L(2): a tie keeps the frame local
    ("tie", [30.0, 30.0], [40.0, 40.0], 0.0, 50.0, ("local", 2, 60.0)),
    # misses; the server gave no estimate (None: it would not serve it): local
    ("server-unknown", [30.0, 30.0], [None, None], 0.0, 50.0, ("local", 2, 60.0)),
    # the device queue makes local miss; R(0) ignores that queue: 25 ms
    ("queue-pushes-out", [30.0, 30.0], [5.0, 5.0], 10.0, 65.0, ("full", 0, 25.0)),
]


@pytest.mark.parametrize(
    ("stage_ms", "server_ms", "local_wait_ms", "deadline_ms", "expected"),
    [case[1:] for case in BINARY_CASES],
    ids=[case[0] for case in BINARY_CASES],
)
def test_binary_hand_computed(
    stage_ms: list[float],
    server_ms: list[float | None],
    local_wait_ms: float,
    deadline_ms: float,
    expected: tuple[str, int, float],
) -> None:
    c = costs(stage_ms, server_ms, [2000, 800], local_wait_ms=local_wait_ms)
    d = decide("binary", c, ThroughputEstimate(100.0), deadline_ms)
    assert (d.kind, d.split, d.predicted_ms) == expected


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_binary_is_local_iff_it_fits_else_the_smaller(data: st.DataObject) -> None:
    c, bytes_per_ms = data.draw(costs_and_link())
    deadline_ms = float(data.draw(st.integers(0, 200)))
    d = decide("binary", c, ThroughputEstimate(bytes_per_ms), deadline_ms)
    n = c.n_stages
    local, remote = doc_local(c, n), doc_remote(c, 0, bytes_per_ms)
    if local <= deadline_ms:
        assert d == Decision("local", n, local)
    elif remote < local:
        assert d == Decision("full", 0, remote)
    else:
        assert d == Decision("local", n, local)


# --- partial ---------------------------------------------------------------------------------------


def test_partial_hand_computed_split_wins() -> None:
    # N = 3; stages 10, 10, 40 ms; payloads 4000 (JPEG), 3000, 200 bytes at 100 bytes/ms;
    # encode 0, 2, 1 ms; server 30, 25, 5 ms.
    # R(0) = 0 + 0 + 40 + 30 = 70; R(1) = 10 + 2 + 30 + 25 = 67; R(2) = 20 + 1 + 2 + 5 = 28;
    # R(3) = L(3) = 60.  -> k = 2, partial, 28 ms
    c = costs([10.0, 10.0, 40.0], [30.0, 25.0, 5.0], [4000, 3000, 200], [0.0, 2.0, 1.0])
    assert decide("partial", c, ThroughputEstimate(100.0), 1.0) == Decision("partial", 2, 28.0)


def test_partial_keeps_a_frame_local_that_meets_its_deadline() -> None:
    # the costs above (R(2) = 28 < L(3) = 60), but the deadline is 60 ms: local fits, so local
    c = costs([10.0, 10.0, 40.0], [30.0, 25.0, 5.0], [4000, 3000, 200], [0.0, 2.0, 1.0])
    assert decide("partial", c, ThroughputEstimate(100.0), 60.0) == Decision("local", 3, 60.0)
    assert decide("partial", c, ThroughputEstimate(100.0), 59.0) == Decision("partial", 2, 28.0)


def test_partial_hand_computed_queues_count() -> None:
    # as above, with a 5 ms device queue and a 10 ms uplink queue:
    # R(0) = 0 + 0 + 50 + 30 = 80; R(1) = 15 + 2 + 40 + 25 = 82; R(2) = 25 + 1 + 12 + 5 = 43;
    # R(3) = 65  -> k = 2, 43 ms
    c = costs([10.0, 10.0, 40.0], [30.0, 25.0, 5.0], [4000, 3000, 200], [0.0, 2.0, 1.0], 5.0, 10.0)
    assert decide("partial", c, ThroughputEstimate(100.0), 1.0) == Decision("partial", 2, 43.0)


def test_partial_ties_go_to_the_smaller_split() -> None:
    # every R(k) = 40: k = 0 (the least client work) wins
    # R(0) = 0 + 20 + 20 = 40; R(1) = 10 + 10 + 20 = 40; R(2) = 20 + 0 + 20 = 40; R(3) = 40
    c = costs([10.0, 10.0, 20.0], [20.0, 20.0, 20.0], [2000, 1000, 0])
    assert decide("partial", c, ThroughputEstimate(100.0), 1.0) == Decision("full", 0, 40.0)
    # R(0) and R(1) worse, R(2) ties with local: the split wins over running everything
    c = costs([10.0, 10.0, 20.0], [50.0, 50.0, 20.0], [2000, 1000, 0])
    assert decide("partial", c, ThroughputEstimate(100.0), 1.0) == Decision("partial", 2, 40.0)


def test_partial_without_server_estimates_runs_locally() -> None:
    c = costs([10.0, 10.0, 20.0], [None, None, None], [2000, 1000, 10])
    assert decide("partial", c, ThroughputEstimate(1e9), 1.0) == Decision("local", 3, 40.0)
    # only the split at 2 is served: R(2) = 20 + 0 + 0.1 + 1 = 21.1 < 40
    c = costs([10.0, 10.0, 20.0], [None, None, 1.0], [2000, 1000, 10])
    d = decide("partial", c, ThroughputEstimate(100.0), 1.0)
    assert (d.kind, d.split) == ("partial", 2)
    assert d.predicted_ms == pytest.approx(21.1)


@st.composite
def costs_and_link(draw: st.DrawFn) -> tuple[Costs, float]:
    """Random costs of whole numbers and a power-of-two throughput: every R(k) is exact."""
    n = draw(st.integers(1, 8))
    ints = st.integers(0, 60).map(float)
    stage_ms = draw(st.lists(ints, min_size=n, max_size=n))
    encode_ms = draw(st.lists(ints, min_size=n, max_size=n))
    payload = draw(st.lists(st.integers(0, 4096), min_size=n, max_size=n))
    server = draw(st.lists(st.one_of(st.none(), ints), min_size=n, max_size=n))
    local_wait = draw(ints)
    uplink_wait = draw(ints)
    bytes_per_ms = 2.0 ** draw(st.integers(-2, 6))
    return Costs(stage_ms, encode_ms, payload, server, local_wait, uplink_wait), bytes_per_ms


@settings(max_examples=500, deadline=None)
@given(data=st.data())
def test_partial_is_the_brute_force_argmin_ties_to_smaller_k(data: st.DataObject) -> None:
    c, bytes_per_ms = data.draw(costs_and_link())
    deadline_ms = float(data.draw(st.integers(0, 300)))
    d = decide("partial", c, ThroughputEstimate(bytes_per_ms), deadline_ms)
    n = c.n_stages
    if doc_local(c, n) <= deadline_ms:  # local makes it: nothing is offloaded
        assert d == Decision("local", n, doc_local(c, n))
        return
    r = [doc_r(c, k, bytes_per_ms) for k in range(n + 1)]
    best = min(r)
    k = r.index(best)  # the first (smallest) k attaining the minimum
    kind: Kind = "local" if k == n else ("full" if k == 0 else "partial")
    assert d == Decision(kind, k, best)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), mode=st.sampled_from(MODES))
def test_predicted_ms_is_the_docstring_formula_at_the_chosen_split(
    data: st.DataObject, mode: str
) -> None:
    c, bytes_per_ms = data.draw(costs_and_link())
    d = decide(mode, c, ThroughputEstimate(bytes_per_ms), 100.0)  # type: ignore[arg-type]
    assert 0 <= d.split <= c.n_stages
    assert d.predicted_ms == doc_r(c, d.split, bytes_per_ms)
    assert d.kind == ("local" if d.split == c.n_stages else "full" if d.split == 0 else "partial")


def test_split_prediction_counts_the_device_queue() -> None:
    # R(1) = L(1) + encode + T + S with L(1) = local_wait + stage 0 = 7 + 3 = 10
    c = costs([3.0, 100.0], [None, 4.0], [0, 200], [0.0, 2.0], local_wait_ms=7.0)
    d = decide("partial", c, ThroughputEstimate(100.0), 1.0)
    assert d == Decision("partial", 1, 10.0 + 2.0 + 2.0 + 4.0)


def test_full_offload_prediction_leaves_out_the_device_queue() -> None:
    c = costs([10.0, 10.0], [5.0, 5.0], [1000, 500], local_wait_ms=30.0)
    d = decide("none", c, ThroughputEstimate(100.0), 1.0)
    # docstring: R(0) = encode(0) + T(0) + S(0) = 0 + 10 + 5; the frame waits for no device
    assert d.predicted_ms == 15.0

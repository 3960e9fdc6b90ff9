"""Feature maps on the wire (`layerexec.features`), as properties:

- lossless H.264: decode_uint8(encode_uint8(q), q.shape) == q exactly, for uint8 arrays of 1 to
  4 dimensions, odd sizes included (1, 1x1, 3x5x7, 1x1x1x1, long vectors), and any values
  (constant, all 0, all 255, narrow ranges, full-range noise, gradients, sparse spikes);
- encode_features / decode_features: every element comes back within half a quantisation step
  (scale / 2, plus float32 rounding), and the h264 and raw codecs decode to identical tensors;
- bytes that do not hold the declared feature map (cut short, garbage, a shape that does not
  fit, an unknown codec) raise FeatureError with a sentence saying what was expected.

"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from layerexec.features import (
    CODECS,
    FeatureError,
    decode_features,
    decode_uint8,
    encode_features,
    encode_uint8,
    tile,
    untile,
)

CODEC_SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
F32_EPS = float(torch.finfo(torch.float32).eps)


# --- strategies --------------------------------------------------------------------------------
def shapes() -> st.SearchStrategy[tuple[int, ...]]:
    """1-D to 4-D, sides from 1 (odd and degenerate sizes are the interesting ones), plus long
    vectors (a flattened classifier input is one plane of 1 x L)."""
    return st.one_of(
        hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=24),
        st.tuples(st.integers(1, 4096)),
    )


VALUE_KINDS = ("noise", "constant", "zeros", "full", "narrow", "gradient", "spikes")


def _uint8_values(kind: str, shape: tuple[int, ...], seed: int, level: int) -> np.ndarray:
    """A deterministic uint8 array of `shape`; `level` picks the constant or the range's base."""
    rng = np.random.default_rng(seed)
    n = math.prod(shape)
    if kind == "constant":
        flat = np.full(n, level, dtype=np.uint8)
    elif kind == "zeros":
        flat = np.zeros(n, dtype=np.uint8)
    elif kind == "full":
        flat = np.full(n, 255, dtype=np.uint8)
    elif kind == "narrow":  # a few adjacent values, as a quantised low-variance map gives
        flat = (level + rng.integers(0, 3, n)).clip(0, 255).astype(np.uint8)
    elif kind == "gradient":
        flat = ((np.arange(n) * 255) // max(n - 1, 1)).astype(np.uint8)
    elif kind == "spikes":  # mostly zero (ReLU), a few extremes
        flat = np.where(rng.random(n) < 0.05, 255, 0).astype(np.uint8)
    else:
        flat = rng.integers(0, 256, n, dtype=np.uint8)
    return flat.reshape(shape)


@st.composite
def uint8_arrays(draw: st.DrawFn) -> np.ndarray:
    shape = draw(shapes())
    if draw(st.booleans()) and math.prod(shape) <= 512:  # element by element: shrinks well
        return draw(hnp.arrays(np.uint8, shape, elements=st.integers(0, 255)))
    kind = draw(st.sampled_from(VALUE_KINDS))
    return _uint8_values(kind, shape, draw(st.integers(0, 2**16)), draw(st.integers(0, 255)))


FLOAT_KINDS = ("normal", "relu", "negative", "constant", "zeros", "outliers")


@st.composite
def float_tensors(draw: st.DrawFn) -> torch.Tensor:
    """Feature-map-like float32 tensors at magnitudes from 1e-3 to 1e4."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=16))
    if draw(st.booleans()):
        values = st.floats(-1e4, 1e4, width=32, allow_subnormal=False)
        return torch.from_numpy(draw(hnp.arrays(np.float32, shape, elements=values)))
    kind = draw(st.sampled_from(FLOAT_KINDS))
    magnitude = draw(st.sampled_from([1e-3, 0.1, 1.0, 37.0, 1e4]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(shape, generator=g) * magnitude
    if kind == "relu":
        return x.clamp(min=0)
    if kind == "negative":
        return -x.abs()
    if kind == "constant":
        return torch.full(shape, float(x.flatten()[0]))
    if kind == "zeros":
        return torch.zeros(shape)
    if kind == "outliers":
        return torch.where(torch.rand(shape, generator=g) < 0.02, x * 100, x)
    return x


# --- lossless H.264 of uint8 arrays -------------------------------------------------------------
@given(q=uint8_arrays())
@example(q=np.zeros((1, 1), np.uint8))
@example(q=np.full((3, 5, 7), 255, np.uint8))
@example(q=np.array([[[[7]]]], np.uint8))
@example(q=_uint8_values("noise", (3, 5, 7), 1, 0))
@example(q=_uint8_values("noise", (1, 4096), 2, 0))
@example(q=_uint8_values("spikes", (2, 3, 17, 9), 3, 0))
@CODEC_SETTINGS
def test_h264_round_trip_is_exact(q: np.ndarray) -> None:
    data = encode_uint8(q)
    back = decode_uint8(data, q.shape)
    assert back.dtype == np.uint8 and back.shape == q.shape
    np.testing.assert_array_equal(back, q)


@given(q=uint8_arrays())
@settings(max_examples=100, deadline=None)
def test_tile_untile_round_trip(q: np.ndarray) -> None:
    frame = tile(q)
    assert frame.ndim == 2 and frame.dtype == np.uint8
    assert frame.size >= q.size  # the grid has room for every plane
    np.testing.assert_array_equal(untile(frame, q.shape), q)


# --- quantised float feature maps ---------------------------------------------------------------
@given(x=float_tensors(), position=st.integers(0, 40))
@example(x=torch.zeros(1), position=0)
@example(x=torch.full((3, 5, 7), -2.5), position=3)
@example(x=torch.tensor([[[[1e4]]]]), position=1)
@CODEC_SETTINGS
def test_encode_decode_features_is_within_half_a_step(x: torch.Tensor, position: int) -> None:
    decoded = {}
    for codec in CODECS:
        ef = encode_features(x, position, codec)
        assert (ef.position, ef.shape, ef.codec) == (position, tuple(x.shape), codec)
        assert 0 <= ef.zero_point <= 255 and ef.scale > 0
        back = decode_features(list(ef.shape), ef.scale, ef.zero_point, ef.codec, ef.data)
        assert back.dtype == torch.float32 and back.shape == x.shape
        # half a step from rounding, plus float32 rounding of values up to 255 steps from 0
        slack = ef.scale / 2 + 4 * F32_EPS * float(x.abs().max())
        err = float((back - x).abs().max())
        assert err <= slack, f"{codec}: error {err} above {slack} (scale {ef.scale})"
        assert bool((back[x == 0] == 0).all()), f"{codec}: zero must come back as exactly zero"
        decoded[codec] = back
    assert torch.equal(decoded["h264"], decoded["raw"])


def test_raw_codec_sends_the_quantised_bytes() -> None:
    x = torch.tensor([[-1.0, 0.0], [1.5, 3.0]])
    ef = encode_features(x, 2, "raw")
    assert len(ef.data) == x.numel()
    assert list(ef.data) == [0, ef.zero_point, ef.zero_point + round(1.5 / ef.scale), 255]


def test_h264_compresses_a_sparse_feature_map() -> None:
    """The point of the codec: a ReLU map with few non-zeros is much smaller than its bytes."""
    x = torch.randn(32, 40, 40, generator=torch.Generator().manual_seed(0)).clamp(min=1.5)
    x -= 1.5
    ef = encode_features(x, 1, "h264")
    assert len(ef.data) < x.numel() / 2


# --- bytes that do not hold the declared feature map -------------------------------------------
def _sample(shape: tuple[int, ...] = (16, 20, 20), seed: int = 0) -> np.ndarray:
    return _uint8_values("noise", shape, seed, 0)


@pytest.mark.parametrize("keep", [0, 1, 4, 10, 100])
def test_h264_cut_inside_the_headers_is_a_feature_error(keep: int) -> None:
    data = encode_uint8(_sample())
    with pytest.raises(FeatureError, match=r"^the H\.264 data (could not be decoded|holds no)"):
        decode_uint8(data[:keep], (16, 20, 20))


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.99])
def test_h264_cut_inside_the_picture_is_a_feature_error(fraction: float) -> None:
    q = _sample()
    data = encode_uint8(q)
    cut = data[: int(len(data) * fraction)]
    with pytest.raises(FeatureError):
        back = decode_uint8(cut, q.shape)
        assert np.array_equal(back, q), "a truncated payload decoded silently to other values"


@given(garbage=st.binary(max_size=3000))
@example(garbage=b"")
@example(garbage=b"\x00\x00\x00\x01" + bytes(200))
@example(garbage=b"\x00\x00\x00\x01\x67" + bytes(range(256)))
@CODEC_SETTINGS
def test_h264_garbage_is_a_feature_error(garbage: bytes) -> None:
    with pytest.raises(FeatureError, match=r"H\.264 data"):
        decode_uint8(garbage, (4, 8, 8))


@pytest.mark.parametrize(
    ("declared", "expected"),
    [
        ((16, 20, 21), "expected 84x80"),  # one column more per plane
        ((4, 20, 20), "expected 40x40"),  # fewer planes
        ((17, 20, 20), "expected 100x80"),  # one plane more: a wider grid
        ((6401,), "expected 81x81"),  # a vector: one square plane, zero-padded
        ((16, 400), "expected 400x16"),
    ],
)
def test_h264_shape_that_does_not_fit_is_a_feature_error(
    declared: tuple[int, ...], expected: str
) -> None:
    data = encode_uint8(_sample())  # 16 planes of 20x20: a 4x4 grid, 80x80
    with pytest.raises(FeatureError, match=rf"a frame of 80x80 does not hold shape .*{expected}"):
        decode_features(declared, 0.1, 3, "h264", data)


@pytest.mark.parametrize("extra", [-1, 1, -100])
def test_raw_wrong_length_is_a_feature_error(extra: int) -> None:
    data = _sample((3, 5, 7)).tobytes()
    data = data[:extra] if extra < 0 else data + bytes(extra)
    with pytest.raises(
        FeatureError, match=r"raw data of \d+ bytes for shape \[3, 5, 7\] \(105 bytes"
    ):
        decode_features((3, 5, 7), 0.1, 3, "raw", data)


def test_unknown_codec_is_a_feature_error_naming_the_known_ones() -> None:
    with pytest.raises(FeatureError, match=r"codec 'png' is not one of h264, raw"):
        decode_features((1,), 1.0, 0, "png", b"\x00")


def test_a_long_vector_encodes() -> None:
    x = torch.rand(25088, generator=torch.Generator().manual_seed(0))  # vgg16 in_shapes[13]
    ef = encode_features(x, 13, "h264")
    back = decode_features(list(ef.shape), ef.scale, ef.zero_point, ef.codec, ef.data)
    assert float((back - x).abs().max()) <= ef.scale / 2 + 4 * F32_EPS


@pytest.mark.parametrize("shape", [(0,), (3, 0, 4)])
def test_an_empty_array_round_trips_or_is_refused_clearly(shape: tuple[int, ...]) -> None:
    q = np.zeros(shape, np.uint8)
    try:
        back = decode_uint8(encode_uint8(q), shape)
    except FeatureError:
        return
    assert back.shape == shape

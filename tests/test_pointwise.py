"""layerexec/pointwise.py: 1x1 convolutions routed to oneDNN compute what torch's own pick does,
run on oneDNN where torch on one thread would not, and are routed in every model the zoo loads."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from layerexec.pointwise import OneDnnPointwise, routable, route_pointwise_convs
from layerexec.script import script_stages
from layerexec.zoo import load_model

needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN"
)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def kernels(fn: Callable[[torch.Tensor], object], x: torch.Tensor) -> set[str]:
    """The convolution ops torch ran for fn(x)."""
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as p:
        fn(x)
    return {e.key for e in p.key_averages() if "conv" in e.key}


def net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 24, 1),  # routable
        nn.Conv2d(24, 24, 1, groups=2),
        nn.Conv2d(24, 32, 1, stride=2),
        nn.Conv2d(32, 32, 1, bias=False),  # routable
    ).eval()


def test_only_plain_unstrided_ungrouped_unpadded_1x1_convolutions_are_routable() -> None:
    assert routable(nn.Conv2d(4, 4, 1))
    assert routable(nn.Conv2d(4, 4, 1, bias=False))
    assert not routable(nn.Conv2d(4, 4, 3))
    assert not routable(nn.Conv2d(4, 4, 1, stride=2))
    assert not routable(nn.Conv2d(4, 4, 1, dilation=2))
    assert not routable(nn.Conv2d(4, 4, 1, groups=2))
    assert not routable(nn.Conv2d(4, 4, 1, padding=1))
    assert not routable(nn.Conv1d(4, 4, 1))
    assert not routable(OneDnnPointwise(4, 4, 1))  # routed already


@pytest.mark.parametrize("channels_last", [True, False])
def test_routed_convolutions_compute_what_torch_does(channels_last: bool) -> None:
    plain, routed = net(), net()
    assert route_pointwise_convs(routed) == 2
    assert [type(m) for m in routed if isinstance(m, nn.Conv2d)].count(OneDnnPointwise) == 2
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    with torch_threads(1), torch.inference_mode():
        for n in (1, 3, 16):
            x = torch.rand(n, 8, 20, 20, generator=torch.Generator().manual_seed(n))
            x = x.contiguous(memory_format=fmt)
            want, got = plain(x), routed(x)
            assert got.shape == want.shape
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


@needs_onednn
def test_on_one_thread_below_batch_16_a_routed_convolution_runs_on_onednn() -> None:
    conv = nn.Conv2d(64, 64, 1).eval().to(memory_format=torch.channels_last)
    x = torch.rand(4, 64, 28, 28).contiguous(memory_format=torch.channels_last)
    with torch_threads(1):
        native = kernels(conv, x)  # torch's own pick
        assert "aten::_slow_conv2d_forward" in native and "aten::mkldnn_convolution" not in native
        route_pointwise_convs(conv)
        assert type(conv) is OneDnnPointwise
        routed = kernels(conv, x)
        assert "aten::mkldnn_convolution" in routed and "aten::_slow_conv2d_forward" not in routed


def test_where_onednn_does_not_apply_a_routed_convolution_is_torchs_own() -> None:
    conv = nn.Conv2d(4, 6, 1)
    plain = nn.Conv2d(4, 6, 1)
    plain.load_state_dict(conv.state_dict())
    route_pointwise_convs(conv)
    x = torch.rand(2, 4, 5, 5, requires_grad=True)
    conv(x).sum().backward()  # gradients wanted
    assert x.grad is not None and conv.weight.grad is not None
    with torch.inference_mode():
        xd = x.detach().double()
        got = conv.double()(xd)  # float64
        assert got.dtype == torch.float64 and torch.equal(got, plain.double()(xd))


@needs_onednn
def test_the_zoo_routes_every_1x1_convolution_and_its_stages_keep_them_scripted() -> None:
    m = load_model("mobilenet_v2")
    convs = [c for c in m.module.modules() if isinstance(c, nn.Conv2d)]
    pointwise = [c for c in convs if c.kernel_size == (1, 1)]
    assert len(pointwise) == 34 and all(type(c) is OneDnnPointwise for c in pointwise)
    assert not any(type(c) is OneDnnPointwise for c in convs if c.kernel_size != (1, 1))
    staged = [c for s in m.stages for c in s.modules() if c.__class__ is OneDnnPointwise]
    assert len(staged) == 34
    scripted = script_stages(m, channels_last=True)
    x = torch.rand(3, *m.spec.input_shape).contiguous(memory_format=torch.channels_last)
    with torch_threads(1), torch.inference_mode():
        ran = kernels(scripted.run, x)
    assert "aten::mkldnn_convolution" in ran and "aten::_slow_conv2d_forward" not in ran

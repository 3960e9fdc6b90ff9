"""1x1 convolutions on oneDNN at every batch size (`route_pointwise_convs`).

PyTorch picks a CPU convolution's kernel on every call. A float32 1x1 convolution with stride 1
and no dilation goes to oneDNN only when torch runs more than one thread or the batch holds 16
or more; otherwise it goes to the native im2col + GEMM kernel (`aten::_slow_conv2d_forward`),
which on channels-last input also copies its input and output between layouts. A one-thread
lane (each of the server's `--replicas` on two cores) below batch 16 thus runs every 1x1
convolution the slow way. Measured here on one thread, channels-last, stages as TorchScript
(`bench/pointwise_conv.py`): routed to oneDNN, mobilenet_v2 (34 of its 52 convolutions are 1x1)
ran batches of 2-15 1.11-1.19x faster and googlenet (37 of 57) 1.05-1.07x, batches of 1 and 16
the same; resnet18 has no unstrided 1x1 convolution. Routed, a batch of 4 costs a sample about
what a batch of 16 does, so the plans' small batches are no longer the dear ones.

A routed convolution calls `aten::mkldnn_convolution`, the kernel torch itself picks at 16 or
more: the same weights and the same function up to float rounding. It does so only where that
kernel applies (a float32 CPU input, torch built with oneDNN, no gradient wanted); anywhere else
it is the `nn.Conv2d` it was. Traced into TorchScript (`layerexec.script`), the stage keeps the
kernel it was traced with, so a stage is traced on the device and dtype it will run on, as
`script_stages` does.
"""

from __future__ import annotations

import torch
from torch import nn


class OneDnnPointwise(nn.Conv2d):
    """An `nn.Conv2d` of kernel 1x1, stride 1, no dilation, one group and no padding that runs on
    oneDNN at every batch size where oneDNN can run it (module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            x.device.type == "cpu"
            and x.dtype == torch.float32
            and self.weight.dtype == torch.float32
            and torch.backends.mkldnn.is_available()
            and torch.backends.mkldnn.enabled
            and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))
        ):
            y: torch.Tensor = torch.ops.aten.mkldnn_convolution(
                x, self.weight, self.bias, [0, 0], [1, 1], [1, 1], 1
            )
            return y
        return super().forward(x)


def routable(m: nn.Module) -> bool:
    """Whether `m` is a plain `nn.Conv2d` whose every call is one 1x1, stride-1, undilated,
    ungrouped, unpadded convolution."""
    return (
        type(m) is nn.Conv2d
        and m.kernel_size == (1, 1)
        and m.stride == (1, 1)
        and m.dilation == (1, 1)
        and m.groups == 1
        and m.padding in ((0, 0), "valid")
        and m.padding_mode == "zeros"
    )


def route_pointwise_convs(module: nn.Module) -> int:
    """Route every 1x1 convolution in `module` to oneDNN at every batch size (module docstring),
    in place: each becomes an `OneDnnPointwise` with the same parameters, so every stage or
    wrapper that holds it runs it so too. Returns how many were routed."""
    routed = [m for m in module.modules() if routable(m)]
    for m in routed:
        m.__class__ = OneDnnPointwise
    return len(routed)

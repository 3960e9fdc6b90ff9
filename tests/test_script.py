"""layerexec/script.py: stages compiled to TorchScript compute what the eager stages do, and a
stage that would not stays eager."""

from __future__ import annotations

import torch
from torch import nn

from layerexec.script import script_stages, scripted_count
from layerexec.zoo import StagedModel, load_model

CIFAR = "resnet20_cifar10"


def batch(model: StagedModel, n: int, seed: int = 0) -> torch.Tensor:
    x = torch.rand(n, *model.spec.input_shape, generator=torch.Generator().manual_seed(seed))
    return x.contiguous(memory_format=torch.channels_last)


def test_every_stage_of_a_zoo_model_is_scripted_and_computes_the_same() -> None:
    eager = load_model(CIFAR)
    stages = eager.stages
    scripted = script_stages(eager, channels_last=True)
    assert scripted_count(scripted) == len(scripted.stages) == len(stages)
    assert eager.stages is stages  # the model passed in keeps its eager stages
    for n in (1, 5):  # batch sizes neither traced (2) nor checked (3)
        x = batch(eager, n, seed=n)
        want, got = eager.run(x), scripted.run(x)
        assert isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor)
        assert got.shape == want.shape == (n, 10)
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_scripted_stage_takes_batch_sizes_in_any_order() -> None:
    # the same stage called on different batch sizes in turn: no shape is baked in
    scripted = script_stages(load_model(CIFAR), channels_last=True)
    first = scripted.stages[0]
    outs = [first(batch(scripted, n)) for n in (3, 1, 4)]
    assert [o.shape[0] for o in outs] == [3, 1, 4]


class _BatchOfTwoOnly(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 2:  # tracing bakes this branch in
            return x * 2
        return x


class _Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x + 1


def staged(*stages: nn.Module) -> StagedModel:
    base = load_model(CIFAR)
    shape = base.spec.input_shape
    return StagedModel(
        base.spec, base.module, tuple(stages), tuple(f"s{i}" for i in range(len(stages))),
        tuple(shape for _ in stages),
    )  # fmt: skip


def test_a_stage_that_traces_a_batch_size_in_or_returns_no_tensor_stays_eager() -> None:
    baked, pair = _BatchOfTwoOnly(), _Pair()
    scripted = script_stages(staged(baked, pair))
    assert scripted.stages == (baked, pair)
    assert scripted_count(scripted) == 0


def test_a_plain_stage_beside_one_that_stays_eager_is_still_scripted() -> None:
    conv = nn.Conv2d(3, 4, 3, padding=1).eval()
    scripted = script_stages(staged(conv, _BatchOfTwoOnly()))
    assert isinstance(scripted.stages[0], torch.jit.ScriptModule)
    assert not isinstance(scripted.stages[1], torch.jit.ScriptModule)
    x = torch.rand(3, 3, 32, 32)
    with torch.inference_mode():
        assert torch.allclose(scripted.stages[0](x), conv(x), atol=1e-6)

"""layerexec.split and layerexec.zoo: stages compute what the whole model computes, cuts are legal,
the stages share the model's weights, and an unknown model lists the known ones."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.fx as fx
from torch import nn

from layerexec import zoo
from layerexec.split import every_cut, heavy_op_cuts, split_model
from tests.exec_cases import (
    Residual,
    ResizeBack,
    assert_same,
    batch,
    staged,
    staged_from,
    whole,
)

ALL_MODELS = sorted(zoo.MODELS)


# --- every zoo model: the stages in order are the whole model --------------------------------
@pytest.mark.parametrize("name", ALL_MODELS)
def test_stages_in_order_compute_exactly_the_whole_model(name: str) -> None:
    m = staged(name)
    assert len(m.stages) == len(m.names) == len(m.in_shapes) >= 2
    x = batch(m.spec.input_shape, 2, seed=11)
    want = whole(m, x)
    assert m.in_shapes[0] == m.spec.input_shape
    y: Any = x
    with torch.inference_mode():
        for k, stage in enumerate(m.stages):
            assert isinstance(y, torch.Tensor), f"stage {k} of {name} gets a non-tensor"
            assert tuple(y.shape) == (2, *m.in_shapes[k]), f"{name} stage {k} ({m.names[k]})"
            y = stage(y)
    # the same ops on the same batch: bit-identical, not just close
    if m.spec.kind == "detector":
        assert isinstance(y, list) and len(y) == 2
        for got, ref in zip(y, want, strict=True):
            assert set(got) == {"boxes", "scores", "labels"}
            assert_same(got, ref, exact=True)
    else:
        assert_same(y, want, exact=True)
    # StagedModel.run is the same chain, and runs any sub-range
    k = len(m.stages) // 2
    assert_same(m.run(m.run(x, 0, k), k), y, exact=True)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ALL_MODELS)
def test_stage_names_are_nonempty_and_distinct(name: str) -> None:
    names = staged(name).names
    assert all(isinstance(n, str) and n.strip() for n in names)
    assert len(set(names)) == len(names)
    assert not any(n.startswith("model.") for n in names)  # the _Out wrapper is not named


@pytest.mark.parametrize("name", ALL_MODELS)
def test_stages_share_the_models_parameters(name: str) -> None:
    """Splitting costs no weight memory: every stage parameter is one of the module's own
    (same storage), and together the stages use all of them."""
    m = staged(name)
    module_ptrs = {p.data_ptr() for p in m.module.parameters()}
    stage_ptrs = {p.data_ptr() for s in m.stages for p in s.parameters()}
    assert stage_ptrs == module_ptrs
    module_ids = {id(p) for p in m.module.parameters()}
    assert all(id(p) in module_ids for s in m.stages for p in s.parameters())


def test_a_change_to_the_models_weights_is_seen_by_the_stages() -> None:
    m = staged_from("res", Residual, (3, 8, 8))
    x = batch((3, 8, 8), 2, seed=1)
    before = m.run(x)
    with torch.no_grad():
        head = m.module.head
        assert isinstance(head, nn.Conv2d) and head.bias is not None
        head.bias.add_(1.0)
    after = m.run(x)
    torch.testing.assert_close(after, before + 1.0)  # type: ignore[operator]


# --- legal cuts ----------------------------------------------------------------------------
def _record_policy(seen: dict[str, Any], inner: Any = every_cut) -> Any:
    def policy(gm: fx.GraphModule, nodes: list[fx.Node], legal: list[int]) -> list[int]:
        seen["nodes"], seen["legal"] = list(nodes), list(legal)
        out: list[int] = inner(gm, nodes, legal)
        return out

    return policy


def _crossing(nodes: list[fx.Node], p: int) -> set[fx.Node]:
    """Independently: the values defined at or before nodes[p] (or the input) used after it."""
    later = set(nodes[p + 1 :])
    placeholder = [n for n in nodes[0].graph.nodes if n.op == "placeholder"]
    return {n for n in [*placeholder, *nodes[: p + 1]] if any(u in later for u in n.users)}


def _targets(stage: nn.Module) -> set[str]:
    assert isinstance(stage, fx.GraphModule)
    return {str(n.target) for n in stage.graph.nodes if n.op == "call_module"} | {
        getattr(n.target, "__name__", str(n.target))
        for n in stage.graph.nodes
        if n.op == "call_function"
    }


def test_no_cut_falls_inside_a_residual_block() -> None:
    seen: dict[str, Any] = {}
    m = staged_from("res", Residual, (3, 8, 8), policy=_record_policy(seen))
    nodes, legal = seen["nodes"], seen["legal"]
    names = [n.name for n in nodes]
    # inside the block the skip value x is live beside c1 / relu / c2: no legal cut there
    for inside in ("c1", "relu_1", "c2"):
        assert names.index(inside) not in legal
    # and every legal cut hands over exactly one value (recomputed here, not trusted)
    for p in legal:
        assert len(_crossing(nodes, p)) == 1, names[p]
    # the illegal ones hand over more than one
    for p in set(range(len(nodes) - 1)) - set(legal):
        assert len(_crossing(nodes, p)) > 1, names[p]
    # the finest split keeps the block in one stage
    block = [s for s in m.stages if "c1" in _targets(s)]
    assert len(block) == 1 and {"c1", "c2", "add"} <= _targets(block[0])
    assert len(m.stages) == len(legal) + 1
    x = batch((3, 8, 8), 3, seed=2)
    assert_same(m.run(x), whole(m, x), exact=True)


def test_a_shape_dependent_resize_at_the_end_does_not_pin_the_input() -> None:
    """`x.shape[-2:]` is folded to a constant, so cuts exist before the final resize."""
    m = staged_from("seg", ResizeBack, (3, 8, 8))
    assert len(m.stages) == 3  # one per conv (c1, c2, c3 with the resize)
    assert "interpolate" in _targets(m.stages[-1])
    fine = staged_from("seg", ResizeBack, (3, 8, 8), policy=every_cut)
    assert len(fine.stages) > len(m.stages)
    for batch_size in (1, 2, 3):  # the folded size is per sample, so any batch works
        x = batch((3, 8, 8), batch_size, seed=batch_size)
        want = whole(m, x)
        assert want.shape == (batch_size, 2, 8, 8)
        assert_same(m.run(x), want, exact=True)
        assert_same(fine.run(x), want, exact=True)


class _FlattenBySize(nn.Module):
    """The classic `x.view(x.size(0), -1)` before a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 8 * 8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.fc(y.view(y.size(0), -1))


def test_a_batch_size_read_in_forward_is_not_folded_to_the_example_batch() -> None:
    m = staged_from("flat", _FlattenBySize, (3, 8, 8))  # traced on a batch of 2
    x = batch((3, 8, 8), 3, seed=0)
    assert_same(m.run(x), whole(m, x))


def test_a_finer_policy_gives_more_stages_that_still_compose_to_the_whole() -> None:
    m = staged("resnet18")
    x = batch(m.spec.input_shape, 2, seed=3)
    fine = split_model(m.module, x, every_cut)
    assert len(fine.stages) > len(m.stages)
    y: Any = x
    with torch.inference_mode():
        for stage in fine.stages:
            y = stage(y)
    assert_same(y, whole(m, x), exact=True)


def test_the_default_policy_puts_one_weighted_layer_or_block_per_stage() -> None:
    seen: dict[str, Any] = {}
    m = staged_from("res", Residual, (3, 8, 8), policy=_record_policy(seen, heavy_op_cuts))
    # stem | block (c1, c2: no legal cut between them) | head
    assert [
        sorted(t for t in _targets(s) if t in {"stem", "c1", "c2", "head"}) for s in m.stages
    ] == [
        ["stem"],
        ["c1", "c2"],
        ["head"],
    ]
    assert staged_from("res", Residual, (3, 8, 8)).names == m.names


def test_a_policy_choosing_an_illegal_cut_is_refused() -> None:
    seen: dict[str, Any] = {}
    staged_from("res", Residual, (3, 8, 8), policy=_record_policy(seen))
    inside = [n.name for n in seen["nodes"]].index("c1")

    def illegal(gm: fx.GraphModule, nodes: list[fx.Node], legal: list[int]) -> list[int]:
        return [legal[0], inside]

    with pytest.raises(ValueError, match="outside the legal ones"):
        split_model(Residual().eval(), batch((3, 8, 8), 2, 0), illegal)

    def out_of_range(gm: fx.GraphModule, nodes: list[fx.Node], legal: list[int]) -> list[int]:
        return [len(nodes) + 3]

    with pytest.raises(ValueError):
        split_model(Residual().eval(), batch((3, 8, 8), 2, 0), out_of_range)


def test_a_module_fx_cannot_trace_raises_value_error_naming_it() -> None:
    class DataDependent(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x

    with pytest.raises(ValueError, match="DataDependent cannot be traced"):
        split_model(DataDependent(), torch.rand(2, 3))


def test_no_policy_cuts_gives_one_stage() -> None:
    m = staged_from("res", Residual, (3, 8, 8), policy=lambda gm, nodes, legal: [])
    assert len(m.stages) == 1
    x = batch((3, 8, 8), 2, seed=4)
    assert_same(m.run(x), whole(m, x), exact=True)


# --- loading ----------------------------------------------------------------------------------
def test_load_models_loads_a_model_listed_twice_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = zoo.load_model

    def counting(
        name: str, seed: int = zoo.DEFAULT_SEED, fold_batch_norm: bool = True
    ) -> zoo.StagedModel:
        calls.append(name)
        return real(name, seed, fold_batch_norm)

    monkeypatch.setattr(zoo, "load_model", counting)
    # two apps list resnet18
    apps = [("a", ("resnet18",)), ("b", ("resnet18", "mobilenet_v2"))]
    models = zoo.load_models(m for _, chain in apps for m in chain)
    assert calls == ["resnet18", "mobilenet_v2"]
    assert list(models) == ["resnet18", "mobilenet_v2"]
    assert models["resnet18"].name == "resnet18"


def test_the_same_seed_gives_the_same_weights() -> None:
    a, b = zoo.load_model("resnet18"), staged("resnet18")
    c = zoo.load_model("resnet18", seed=1)
    pa, pb, pc = (next(m.module.parameters()) for m in (a, b, c))
    assert torch.equal(pa, pb)
    assert not torch.equal(pa, pc)
    assert pa.data_ptr() != pb.data_ptr()  # a fresh load is its own copy


def test_an_unknown_model_lists_the_known_ones() -> None:
    for call in (
        lambda: zoo.spec("nosuch"),
        lambda: zoo.load_model("nosuch"),
        lambda: zoo.load_models(["resnet18", "nosuch"]),
    ):
        with pytest.raises(zoo.UnknownModel) as info:
            call()
        text = str(info.value)
        assert "'nosuch'" in text
        assert all(name in text for name in zoo.MODELS)
        assert "\n" not in text
    assert issubclass(zoo.UnknownModel, ValueError)


def test_every_model_has_a_known_kind_and_a_positive_input_shape() -> None:
    for name, s in zoo.MODELS.items():
        assert s.name == name
        assert s.kind in ("classifier", "segmenter", "detector", "face-detector")
        assert len(s.input_shape) == 3 and all(d > 0 for d in s.input_shape)
        assert s.weights

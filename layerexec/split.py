"""Splitting a model into stages with torch.fx (the caller picks the cuts; this does the mechanics).

A *cut* after node p of the traced graph is legal when exactly one value computed at or before p
is used after p, and that value is a tensor: the stage before the cut hands exactly that tensor
to the stage after it. Parameters (`get_attr`) are shared, not handed over. Values computed only
from input shapes (e.g. `x.shape[-2:]` for a final resize) are folded to constants for the
model's fixed input shape (not those that depend on the batch size), so they do not pin a second
live value across the whole graph.

Which legal cuts become stage boundaries is a policy: `heavy_op_cuts` (the default) cuts at the
last legal point before each convolution or linear layer, so that a stage is one weighted layer
with the cheap element-wise work after it, or a whole block (a residual or inception block has no
legal cut inside). The stages share the model's parameters (one copy in memory), and running
them in order computes exactly what the traced model computes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

HEAVY_MODULES = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d, nn.Linear)
HEAVY_FUNCTIONS = {F.conv2d, F.linear, torch.conv2d, torch.matmul, torch.mm, torch.bmm}
Policy = Callable[[fx.GraphModule, list[fx.Node], list[int]], list[int]]


@dataclass(frozen=True)
class Split:
    """The stages of one model: `stages[k]` maps the output of stage k-1 to its own output."""

    stages: tuple[fx.GraphModule, ...]
    names: tuple[str, ...]


def split_model(module: nn.Module, example: torch.Tensor, policy: Policy | None = None) -> Split:
    """Trace `module` (eval mode) on `example` (a batch) and cut it into stages at legal cuts
    chosen by `policy` (default `heavy_op_cuts`). Raises ValueError if it cannot be traced."""
    try:
        gm = fx.symbolic_trace(module)
    except Exception as exc:  # fx raises many types; the caller needs one
        raise ValueError(f"{type(module).__name__} cannot be traced by torch.fx: {exc}") from exc
    values = _run_and_record(gm, example)
    other = _run_and_record(gm, torch.cat([example, example[:1]]))  # one more sample
    _fold_shape_constants(gm, values, other)
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]
    legal = legal_cuts(gm, values)
    cuts = sorted(set((policy or heavy_op_cuts)(gm, nodes, legal)))
    if any(c not in legal for c in cuts):
        raise ValueError(f"policy chose cuts {cuts} outside the legal ones {legal}")
    return _build(gm, nodes, cuts)


def legal_cuts(gm: fx.GraphModule, values: dict[fx.Node, Any]) -> list[int]:
    """Indices p (into the compute nodes) after which exactly one tensor is live."""
    order = [n for n in gm.graph.nodes if n.op != "get_attr"]
    index = {n: i for i, n in enumerate(order)}
    last_use = {n: max((index[u] for u in n.users if u in index), default=-1) for n in order}
    compute = [n for n in order if n.op not in ("placeholder", "output")]
    out = []
    for p, node in enumerate(compute[:-1]):
        at = index[node]
        live = [n for n in order[: at + 1] if last_use[n] > at]
        if len(live) == 1 and isinstance(values.get(live[0]), torch.Tensor):
            out.append(p)
    return out


def heavy_op_cuts(gm: fx.GraphModule, nodes: list[fx.Node], legal: list[int]) -> list[int]:
    """The last legal cut before each heavy node (conv / linear) that follows another one."""
    heavy = [i for i, n in enumerate(nodes) if _is_heavy(gm, n)]
    cuts = []
    for prev, nxt in itertools.pairwise(heavy):
        options = [p for p in legal if prev <= p < nxt]
        if options:
            cuts.append(options[-1])
    return cuts


def every_cut(gm: fx.GraphModule, nodes: list[fx.Node], legal: list[int]) -> list[int]:
    """Every legal cut (the finest split)."""
    return list(legal)


def _is_heavy(gm: fx.GraphModule, n: fx.Node) -> bool:
    if n.op == "call_module":
        return isinstance(gm.get_submodule(str(n.target)), HEAVY_MODULES)
    return n.op == "call_function" and n.target in HEAVY_FUNCTIONS


def _run_and_record(gm: fx.GraphModule, example: torch.Tensor) -> dict[fx.Node, Any]:
    values: dict[fx.Node, Any] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            out = super().run_node(n)
            values[n] = out
            return out

    with torch.inference_mode():
        Recorder(gm).run(example)
    return values


def _fold_shape_constants(
    gm: fx.GraphModule, values: dict[fx.Node, Any], other: dict[fx.Node, Any]
) -> None:
    """Replace nodes whose value is a shape-derived constant (ints, sizes) by that constant,
    unless it depends on the batch size (it differs between the two recorded runs)."""
    for n in list(gm.graph.nodes):
        if n.op in ("placeholder", "output", "get_attr") or not n.users:
            continue
        v, w = values.get(n), other.get(n)
        if isinstance(v, torch.Size):
            v = tuple(v)
        if isinstance(w, torch.Size):
            w = tuple(w)
        if not _is_plain_constant(v) or v != w:
            continue
        for user in list(n.users):
            user.args = fx.node.map_arg(user.args, _replacing(n, v))
            user.kwargs = fx.node.map_arg(user.kwargs, _replacing(n, v))
    gm.graph.eliminate_dead_code()
    gm.recompile()


def _replacing(node: fx.Node, value: Any) -> Callable[[fx.Node], Any]:
    return lambda a: value if a is node else a


def _is_plain_constant(v: Any) -> bool:
    if isinstance(v, bool | int | float):
        return True
    return isinstance(v, tuple) and all(isinstance(x, bool | int | float) for x in v)


def _build(gm: fx.GraphModule, nodes: Sequence[fx.Node], cuts: list[int]) -> Split:
    placeholder = next(n for n in gm.graph.nodes if n.op == "placeholder")
    output = next(n for n in gm.graph.nodes if n.op == "output")
    bounds = [-1, *cuts, len(nodes) - 1]
    stages, names = [], []
    incoming = placeholder
    for a, b in itertools.pairwise(bounds):
        part = list(nodes[a + 1 : b + 1])
        last = b == len(nodes) - 1
        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {incoming: g.placeholder("x")}

        def lookup(n: fx.Node, env: dict[fx.Node, fx.Node] = env, g: fx.Graph = g) -> fx.Node:
            if n not in env:
                if n.op != "get_attr":
                    raise ValueError(f"node {n.name} crosses a cut")
                env[n] = g.node_copy(n, lookup)
            return env[n]

        for n in part:
            env[n] = g.node_copy(n, lookup)
        if last:
            g.output(fx.node.map_arg(output.args[0], lookup))
        else:
            incoming = _live_after(nodes, b)
            g.output(lookup(incoming))
        stages.append(_flat_module(gm, g))
        names.append(_stage_name(gm, part))
    return Split(tuple(stages), tuple(names))


def _flat_module(gm: fx.GraphModule, g: fx.Graph) -> fx.GraphModule:
    """The stage as a GraphModule that holds the submodules and tensors it uses under flat names
    (`features_1_conv_0_0`), the same objects as the model's: one attribute lookup per call
    instead of a chain of nested `nn.Module.__getattr__`s, which costs ~15 us a stage."""
    owned: dict[str, Any] = {}
    for n in g.nodes:
        if n.op not in ("call_module", "get_attr"):
            continue
        obj: Any = gm
        for atom in str(n.target).split("."):
            obj = getattr(obj, atom)
        flat = str(n.target).replace(".", "_")
        while flat in owned and owned[flat] is not obj:
            flat += "_"
        owned[flat] = obj
        n.target = flat
    g.lint()
    return fx.GraphModule(owned, g)


def _live_after(nodes: Sequence[fx.Node], b: int) -> fx.Node:
    """The one value computed at or before nodes[b] that is used after it."""
    later = set(nodes[b + 1 :])
    for n in reversed(nodes[: b + 1]):
        if any(u in later or u.op == "output" for u in n.users):
            return n
    raise ValueError("no value crosses the cut")


def _stage_name(gm: fx.GraphModule, part: Sequence[fx.Node]) -> str:
    """`conv1+bn1+relu+maxpool`: the modules the stage calls (its functions if none)."""
    labels = [str(n.target) for n in part if n.op == "call_module"]
    if not labels:
        labels = [getattr(n.target, "__name__", str(n.target)) for n in part]
    if len(labels) <= 4:
        return "+".join(labels)
    return f"{labels[0]}..{labels[-1]}"

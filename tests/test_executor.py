"""layerexec.executor: any valid schedule of actions gives every request the whole model's
result; exit checks stop at a stage boundary and lose nothing; refusals change nothing; the
store frees what finishes; shared models batch; chains hand over; stacking runs two at once."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerexec.executor import Executor, NotAtStage, Progress, ShapeError
from layerexec.zoo import StagedModel, load_model
from scheduler import App
from scheduler.types import Action
from tests.exec_cases import (
    SMALL,
    Classifier,
    Residual,
    StageCalls,
    assert_same,
    batch,
    executor_for,
    row,
    staged,
    staged_from,
    whole,
)


def _alone(model: StagedModel, x: torch.Tensor) -> Any:
    """The whole model on one sample alone (batch of 1), as the result for that request."""
    return row(whole(model, x.unsqueeze(0)), 0)


def _admit_all(ex: Executor, app: str, xs: torch.Tensor, prefix: str = "r") -> list[str]:
    ids = [f"{prefix}{i}" for i in range(len(xs))]
    for rid, x in zip(ids, xs, strict=True):
        ex.admit(rid, app, 0, x.clone())
    return ids


def _snapshot(ex: Executor, ids: list[str]) -> dict[str, tuple[str, int, torch.Tensor]]:
    out = {}
    for rid in ids:
        slot = ex.store.get(rid)
        out[rid] = (slot.app, slot.position, slot.value.clone())
    return out


def _assert_unchanged(ex: Executor, before: dict[str, tuple[str, int, torch.Tensor]]) -> None:
    assert len(ex.store) == len(before)
    for rid, (app, position, value) in before.items():
        slot = ex.store.get(rid)
        assert (slot.app, slot.position) == (app, position)
        assert torch.equal(slot.value, value)


# --- equivalence: any valid schedule --------------------------------------------------------
@pytest.mark.parametrize("name", SMALL)
@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_any_schedule_gives_each_request_the_whole_models_result(name: str, data: Any) -> None:
    model = staged(name)
    n = len(model.stages)
    count = data.draw(st.integers(3, 4), label="requests")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    xs = batch(model.spec.input_shape, count, seed)
    ex = executor_for({name: model})
    ids = _admit_all(ex, name, xs)
    position = dict.fromkeys(ids, 0)
    results: dict[str, Any] = {}
    while position:
        k = data.draw(st.sampled_from(sorted(set(position.values()))), label="stage")
        standing = [r for r in ids if position.get(r) == k]
        chosen = data.draw(st.lists(st.sampled_from(standing), min_size=1, unique=True))
        k1 = data.draw(st.integers(k + 1, n), label="end")
        progress = ex.run(Action(name, (k, k1), tuple(chosen)))
        assert progress.stages_done == k1 - k and not progress.cancelled
        assert set(progress.finished) == ({*chosen} if k1 == n else set())
        results.update(progress.finished)
        for r in chosen:
            if k1 == n:
                del position[r]
                assert r not in ex.store
            else:
                position[r] = k1
                slot = ex.store.get(r)
                assert slot.position == k1
                assert tuple(slot.value.shape) == model.in_shapes[k1]
        assert len(ex.store) == len(position)
    assert set(results) == set(ids)
    for i, rid in enumerate(ids):
        assert_same(results[rid], _alone(model, xs[i]))


@pytest.mark.parametrize("name", ["resnet18", "ssdlite320_mobilenet_v3_large"])
def test_requests_can_enter_at_a_later_stage(name: str) -> None:
    """A client that ran the first k stages sends the stage-k input with position k; it batches
    with a request that started at 0 once that one gets there."""
    model = staged(name)
    n = len(model.stages)
    xs = batch(model.spec.input_shape, 3, seed=5)
    ex = executor_for({name: model})
    ex.admit("early", name, 0, xs[0].clone())
    for rid, i, k in (("mid", 1, n // 2), ("last", 2, n - 1)):
        ex.admit(rid, name, k, model.run(xs[i : i + 1], 0, k)[0])  # type: ignore[index]
    ex.run(Action(name, (0, n // 2), ("early",)))
    ex.run(Action(name, (n // 2, n - 1), ("mid", "early")))
    done = ex.run(Action(name, (n - 1, n), ("last", "early", "mid")))
    assert set(done.finished) == {"early", "mid", "last"} and len(ex.store) == 0
    for rid, i in (("early", 0), ("mid", 1), ("last", 2)):
        assert_same(done.finished[rid], _alone(model, xs[i]))


def test_channels_last_executor_gives_the_same_results() -> None:
    model = load_model("resnet20_cifar10")  # a fresh copy: the executor converts it in place
    xs = batch(model.spec.input_shape, 3, seed=6)
    want = [_alone(model, x) for x in xs]
    ex = executor_for({model.name: model}, channels_last=True)
    ids = _admit_all(ex, model.name, xs)
    seen: list[bool] = []
    hook = model.stages[1].register_forward_pre_hook(
        lambda mod, args: seen.append(args[0].is_contiguous(memory_format=torch.channels_last))
    )
    try:
        done = ex.run(Action(model.name, (0, len(model.stages)), tuple(ids)))
    finally:
        hook.remove()
    assert seen == [True]
    for i, rid in enumerate(ids):
        assert_same(done.finished[rid], want[i])


# --- exit checks ------------------------------------------------------------------------------
@pytest.mark.parametrize("j", [0, 1, 4])
def test_cancel_stops_at_a_stage_boundary_and_nothing_is_recomputed(j: int) -> None:
    model = staged("resnet20_cifar10")
    name, n = model.name, len(model.stages)
    xs = batch(model.spec.input_shape, 3, seed=7)
    ex = executor_for({name: model})
    ids = _admit_all(ex, name, xs)
    ex.run(Action(name, (0, 1), tuple(ids)))  # all stand at 1
    with StageCalls(model) as calls:
        first = ex.run(Action(name, (1, n), tuple(ids[:2])), cancel=lambda: calls.total >= j)
        assert first.stages_done == j and first.cancelled and not first.finished
        assert calls.total == j
        for rid in ids[:2]:
            slot = ex.store.get(rid)
            assert slot.position == 1 + j
            assert tuple(slot.value.shape) == model.in_shapes[1 + j]
        assert ex.store.get(ids[2]).position == 1
        rest = ex.run(Action(name, (1 + j, n), tuple(ids[:2])), cancel=lambda: False)
        last = ex.run(Action(name, (1, n), (ids[2],)))
        # every stage from 1 on ran exactly once per request; stage 0 ran before the hooks
        assert calls.samples() == [0] + [3] * (n - 1)
    assert rest.stages_done == n - 1 - j and not rest.cancelled
    results = {**rest.finished, **last.finished}
    assert len(ex.store) == 0
    for i, rid in enumerate(ids):
        assert_same(results[rid], _alone(model, xs[i]))


def test_a_cancelled_action_reports_how_far_it_got() -> None:
    a = Action("m", (2, 7), ("x",))
    assert Progress(a, 5).cancelled is False
    assert Progress(a, 3).cancelled is True
    assert Progress(a, 0).cancelled is True


# --- refusals -------------------------------------------------------------------------------
def test_a_request_not_at_the_first_stage_is_refused_and_nothing_changes() -> None:
    model = staged("resnet18")
    name, n = model.name, len(model.stages)
    other = staged("resnet20_cifar10")
    ex = executor_for({name: model, other.name: other})
    xs = batch(model.spec.input_shape, 3, seed=8)
    ids = _admit_all(ex, name, xs)
    ex.admit("cifar", other.name, 0, batch(other.spec.input_shape, 1, 0)[0])
    ex.run(Action(name, (0, 2), (ids[0],)))
    before = _snapshot(ex, [*ids, "cifar"])
    with StageCalls(model) as calls:
        with pytest.raises(NotAtStage) as info:
            ex.run(Action(name, (0, 3), (ids[1], ids[0], ids[2])))
        assert f"'{ids[0]}'" in str(info.value) and f"{name}[2]" in str(info.value)
        assert f"{name}[0]" in str(info.value)
        with pytest.raises(NotAtStage, match="resnet20_cifar10\\[0\\]"):  # another model
            ex.run(Action(name, (0, 3), (ids[1], "cifar")))
        assert calls.total == 0  # refused before running anything
    _assert_unchanged(ex, before)
    # the others still run to the right results
    ex.run(Action(name, (0, 2), (ids[1], ids[2])))
    done = ex.run(Action(name, (2, n), tuple(ids)))
    for i, rid in enumerate(ids):
        assert_same(done.finished[rid], _alone(model, xs[i]))


def test_a_wrong_shape_at_admit_names_model_stage_and_both_shapes() -> None:
    model = staged("resnet18")
    name, n = model.name, len(model.stages)
    ex = executor_for({name: model})
    xs = batch(model.spec.input_shape, 2, seed=9)
    ids = _admit_all(ex, name, xs)
    before = _snapshot(ex, ids)
    with pytest.raises(ShapeError) as info:
        ex.admit("bad", name, 0, torch.zeros(3, 32, 32))
    text = str(info.value)
    assert name in text and "stage 0" in text and model.names[0] in text
    assert "[3, 224, 224]" in text and "[3, 32, 32]" in text
    k = 3
    want = list(model.in_shapes[k])
    with pytest.raises(ShapeError) as info:
        ex.admit("bad", name, k, torch.zeros(1, *want))  # a batch, not one sample
    text = str(info.value)
    assert f"stage {k}" in text and model.names[k] in text
    assert str(want) in text and str([1, *want]) in text
    with pytest.raises(ShapeError, match="list"):
        ex.admit("bad", name, 0, [xs[0]])  # type: ignore[arg-type]
    assert "bad" not in ex.store
    _assert_unchanged(ex, before)
    done = ex.run(Action(name, (0, n), tuple(ids)))
    for i, rid in enumerate(ids):
        assert_same(done.finished[rid], _alone(model, xs[i]))


def test_an_unknown_request_id_raises_key_error_naming_it() -> None:
    model = staged("resnet20_cifar10")
    name, n = model.name, len(model.stages)
    ex = executor_for({name: model})
    xs = batch(model.spec.input_shape, 2, seed=10)
    ids = _admit_all(ex, name, xs)
    before = _snapshot(ex, ids)
    with StageCalls(model) as calls:
        with pytest.raises(KeyError, match="ghost"):
            ex.run(Action(name, (0, 2), (ids[0], "ghost")))
        assert calls.total == 0
    _assert_unchanged(ex, before)
    with pytest.raises(ValueError, match="already in the store"):
        ex.admit(ids[0], name, 0, torch.zeros(model.spec.input_shape))
    _assert_unchanged(ex, before)
    done = ex.run(Action(name, (0, n), tuple(ids)))
    for i, rid in enumerate(ids):
        assert_same(done.finished[rid], _alone(model, xs[i]))


def test_skip_dropped_runs_the_batch_without_requests_dropped_since_the_plan() -> None:
    """The server plans on its event loop and runs later on the executor thread: a request whose
    client left in between is no longer in the store. With skip_dropped the others run without
    it, and with none left nothing runs."""
    model = staged("resnet20_cifar10")
    name, n = model.name, len(model.stages)
    ex = executor_for({name: model})
    xs = batch(model.spec.input_shape, 3, seed=11)
    a, b, c = _admit_all(ex, name, xs)
    ex.drop([b])
    with StageCalls(model) as calls:
        done = ex.run(Action(name, (0, n), (a, b, c)), skip_dropped=True)
        assert calls.batches[0] == [2]
    assert done.batch == done.batch_size == 2 and done.stages_done == n and not done.cancelled
    assert set(done.finished) == {a, c}
    assert_same(done.finished[a], _alone(model, xs[0]))
    assert_same(done.finished[c], _alone(model, xs[2]))
    with StageCalls(model) as calls:
        empty = ex.run(Action(name, (0, n), (a, b)), skip_dropped=True)
        assert calls.total == 0
    assert (empty.batch, empty.stages_done, empty.finished) == (0, n, {})
    with pytest.raises(KeyError, match=b):  # without it, a missing request is an error
        ex.run(Action(name, (0, n), (b,)))


# --- memory ------------------------------------------------------------------------------------
def test_the_store_frees_a_request_when_it_finishes_or_is_dropped() -> None:
    model = staged("resnet20_cifar10")
    name, n = model.name, len(model.stages)
    ex = executor_for({name: model})
    xs = batch(model.spec.input_shape, 3, seed=12)
    a, b, c = _admit_all(ex, name, xs)
    per_sample = [4 * torch.Size(s).numel() for s in model.in_shapes]
    # nbytes() counts the memory the held tensors keep alive: after an action each request's
    # tensor is a row of the batch output, and that batch is held until its last row moves on
    assert len(ex.store) == 3 and ex.store.nbytes() == 3 * per_sample[0]  # three clones
    ex.run(Action(name, (0, 2), (a, b)))
    assert ex.store.nbytes() == 2 * per_sample[2] + per_sample[0]
    done = ex.run(Action(name, (2, n), (a,)))
    assert set(done.finished) == {a}
    assert len(ex.store) == 2 and a not in ex.store
    assert ex.store.nbytes() == 2 * per_sample[2] + per_sample[0]  # b still holds the batch
    assert ex.drop([b, "never-admitted"]) == 1
    assert len(ex.store) == 1 and ex.store.nbytes() == per_sample[0]
    assert ex.drop([b]) == 0
    with pytest.raises(KeyError, match=b):
        ex.run(Action(name, (2, n), (b,)))
    done = ex.run(Action(name, (0, n), (c,)))
    assert len(ex.store) == 0 and ex.store.nbytes() == 0
    assert_same(done.finished[c], _alone(model, xs[2]))


# --- apps ------------------------------------------------------------------------------------------
def test_two_apps_listing_one_model_batch_in_one_action() -> None:
    model = staged("resnet18")
    name, n = model.name, len(model.stages)
    ex = executor_for({name: model}, apps=[App("a", (name,)), App("b", (name,))])
    xs = batch(model.spec.input_shape, 2, seed=13)
    ex.admit("ra", "a", 0, xs[0])
    ex.admit("rb", "b", 0, xs[1])
    with StageCalls(model) as calls:
        done = ex.run(Action(name, (0, n), ("ra", "rb")))
    assert calls.batches == [[2]] * n  # one batch of both, on the one loaded module
    assert_same(done.finished["ra"], _alone(model, xs[0]))
    assert_same(done.finished["rb"], _alone(model, xs[1]))


def _chain_models() -> tuple[StagedModel, StagedModel]:
    front = staged_from("front", Residual, (3, 8, 8), seed=1)
    back = staged_from("back", Classifier, (4, 8, 8), seed=2)
    return front, back


def test_a_chain_app_hands_the_first_models_output_to_the_second() -> None:
    front, back = _chain_models()
    nf, nb = len(front.stages), len(back.stages)
    assert nf >= 2 and nb >= 2
    apps = [App("front", ("front",)), App("chain", ("front", "back"))]
    ex = executor_for({"front": front, "back": back}, apps)
    xs = batch((3, 8, 8), 3, seed=14)
    ex.admit("solo", "front", 0, xs[0])
    ex.admit("c1", "chain", 0, xs[1])
    # a chain request that entered in the second model, at its second stage
    mid = back.run(front.run(xs[2:3]), 0, 1)[0]  # type: ignore[arg-type, index]
    ex.admit("c2", "chain", nf + 1, mid)
    with pytest.raises(ShapeError, match="back stage 1"):
        ex.admit("bad", "chain", nf + 1, xs[2])
    # both apps' requests batch on the shared front model
    first = ex.run(Action("front", (0, nf), ("solo", "c1")))
    assert set(first.finished) == {"solo"}
    assert_same(first.finished["solo"], _alone(front, xs[0]))
    slot = ex.store.get("c1")
    assert slot.position == nf and tuple(slot.value.shape) == back.in_shapes[0]
    assert_same(slot.value, _alone(front, xs[1]))
    with pytest.raises(NotAtStage):
        ex.run(Action("back", (0, nb), ("c1", "c2")))
    ex.run(Action("back", (0, 1), ("c1",)))
    done = ex.run(Action("back", (1, nb), ("c2", "c1")))
    for rid, i in (("c1", 1), ("c2", 2)):
        want = _alone(back, _alone(front, xs[i]))
        assert_same(done.finished[rid], want)
    assert len(ex.store) == 0


def test_an_executor_refuses_a_profile_whose_stage_count_differs() -> None:
    from scheduler import Deployment
    from tests.exec_cases import profile_for

    model = staged("resnet20_cifar10")
    d = Deployment([profile_for(model.name, len(model.stages) + 1)])
    with pytest.raises(ValueError, match="stages but its profile has"):
        Executor(d, {model.name: model})
    with pytest.raises(ValueError, match="no loaded model"):
        Executor(d, {})


# --- a model whose output is a tuple of batch tensors ------------------------------------------
@pytest.mark.parametrize("size", [1, 2])
def test_a_tuple_output_is_split_per_request(size: int) -> None:
    model = staged("ultraface_slim320")
    name, n = model.name, len(model.stages)
    ex = executor_for({name: model})
    xs = batch(model.spec.input_shape, size, seed=15)
    ids = _admit_all(ex, name, xs)
    ex.run(Action(name, (0, n - 1), tuple(ids)))
    done = ex.run(Action(name, (n - 1, n), tuple(ids)))
    for i, rid in enumerate(ids):
        assert_same(done.finished[rid], _alone(model, xs[i]))


# --- stacking -----------------------------------------------------------------------------------
def test_stacked_actions_of_two_models_run_at_once_and_both_are_right() -> None:
    a, b = staged("resnet20_cifar10"), staged("mobilenet_v2")
    ex = executor_for({a.name: a, b.name: b})
    xa = batch(a.spec.input_shape, 2, seed=16)
    xb = batch(b.spec.input_shape, 2, seed=17)
    ida = _admit_all(ex, a.name, xa, "a")
    idb = _admit_all(ex, b.name, xb, "b")
    # both first stages must be inside their forward at the same time to pass the barrier
    barrier = threading.Barrier(2, timeout=30)
    threads: set[str] = set()

    def meet(mod: Any, args: Any) -> None:
        threads.add(threading.current_thread().name)
        barrier.wait()

    hooks = [m.stages[0].register_forward_pre_hook(meet) for m in (a, b)]
    try:
        pa, pb = ex.run_stacked(
            Action(a.name, (0, len(a.stages)), tuple(ida)),
            Action(b.name, (0, 3), tuple(idb)),
        )
    finally:
        for h in hooks:
            h.remove()
        ex.close()
    assert len(threads) == 2
    assert pa.stages_done == len(a.stages) and pb.stages_done == 3
    assert all(ex.store.get(r).position == 3 for r in idb)
    for i, rid in enumerate(ida):
        assert_same(pa.finished[rid], _alone(a, xa[i]))
    done = ex.run(Action(b.name, (3, len(b.stages)), tuple(idb)))
    for i, rid in enumerate(idb):
        assert_same(done.finished[rid], _alone(b, xb[i]))


def test_stacking_with_a_cancel_stops_only_that_action() -> None:
    a, b = staged("resnet20_cifar10"), staged_from("tiny", Residual, (3, 8, 8))
    ex = executor_for({a.name: a, b.name: b})
    ex.admit("a0", a.name, 0, batch(a.spec.input_shape, 1, 0)[0])
    ex.admit("b0", b.name, 0, batch((3, 8, 8), 1, 0)[0])
    pa, pb = ex.run_stacked(
        Action(a.name, (0, 4), ("a0",)),
        Action(b.name, (0, len(b.stages)), ("b0",)),
        cancel_b=lambda: True,
    )
    ex.close()
    assert (pa.stages_done, pa.cancelled) == (4, False)
    assert (pb.stages_done, pb.cancelled) == (0, True)
    assert ex.store.get("a0").position == 4 and ex.store.get("b0").position == 0


def test_stacking_refuses_one_model_twice_or_shared_requests() -> None:
    a, b = staged("resnet20_cifar10"), staged_from("tiny", Residual, (3, 8, 8))
    ex = executor_for({a.name: a, b.name: b})
    ex.admit("a0", a.name, 0, batch(a.spec.input_shape, 1, 0)[0])
    ex.admit("a1", a.name, 0, batch(a.spec.input_shape, 1, 1)[0])
    ex.admit("b0", b.name, 0, batch((3, 8, 8), 1, 0)[0])
    before = _snapshot(ex, ["a0", "a1", "b0"])
    with StageCalls(a) as calls:
        with pytest.raises(ValueError, match="two different models"):
            ex.run_stacked(Action(a.name, (0, 1), ("a0",)), Action(a.name, (0, 1), ("a1",)))
        with pytest.raises(ValueError, match="share requests"):
            ex.run_stacked(Action(a.name, (0, 1), ("a0",)), Action(b.name, (0, 1), ("a0", "b0")))
        assert calls.total == 0
    ex.close()
    _assert_unchanged(ex, before)

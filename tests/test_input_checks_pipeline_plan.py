"""A single-model pipeline plan records its model and SLO; `plan_from_json` refuses a plan made
for another model (naming both), keeps older plans without those keys loading, and hands the
recorded SLO to the caller. A simulated run in which no request arrives is refused, never
reported as full attainment."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from scheduler.errors import InputError
from scheduler.pipeline.milp import Cluster, plan_pipelines
from scheduler.pipeline.plan import PipelinePlan
from scheduler.pipeline.profiles import ModelProfiles
from sim.pipeline_plan_file import plan_from_json
from sim.pipeline_plane import run_plane

SLO_MS = 10.0


def one_block(name: str) -> ModelProfiles:
    return ModelProfiles(
        model=name, num_blocks=1, latency_us={("A", 1): ((1000.0,),)}, cut_bytes=()
    )


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return Cluster.from_json({"gpus": {"A": {"count": 2, "per_server": 2}}, "nic_gbps": 10})


@pytest.fixture(scope="module")
def plan(cluster: Cluster) -> PipelinePlan:
    return plan_pipelines(one_block("cyclegan"), cluster, SLO_MS, 0.0, 1, 1)


@pytest.fixture(scope="module")
def doc(plan: PipelinePlan) -> dict[str, Any]:
    written: dict[str, Any] = json.loads(json.dumps(plan.to_json()))  # `pipeline plan --json`
    return written


def test_the_plan_document_records_its_model_and_slo(
    plan: PipelinePlan, doc: dict[str, Any]
) -> None:
    assert plan.model == "cyclegan" and plan.slo_ms == SLO_MS
    assert doc["model"] == "cyclegan" and doc["slo_ms"] == SLO_MS
    assert doc["pipelines"] and doc["throughput_rps"] > 0


def test_the_plan_loads_for_its_own_model_with_its_slo(
    cluster: Cluster, doc: dict[str, Any]
) -> None:
    loaded = plan_from_json(doc, one_block("cyclegan"), cluster, "plan.json")
    assert loaded.model == "cyclegan" and loaded.slo_ms == SLO_MS
    assert loaded.throughput_rps == doc["throughput_rps"]


def test_a_plan_for_another_model_is_refused_naming_both(
    cluster: Cluster, doc: dict[str, Any]
) -> None:
    with pytest.raises(InputError) as info:
        plan_from_json(doc, one_block("repvgg-b3"), cluster, "plan.json")
    assert str(info.value) == (
        "plan.json: model: expected a plan for repvgg-b3, the model being simulated (this plan "
        "was made for cyclegan; simulate it with --model cyclegan)"
    )


def test_an_older_plan_without_model_or_slo_still_loads(
    cluster: Cluster, doc: dict[str, Any]
) -> None:
    old = {k: v for k, v in doc.items() if k not in ("model", "slo_ms")}
    loaded = plan_from_json(old, one_block("anything"), cluster, "plan.json")
    assert loaded.slo_ms is None and loaded.model == "anything"


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("model", 5, "plan.json: model: expected the name of the model the plan was made for"),
        ("model", "", "plan.json: model: expected the name of the model the plan was made for"),
        ("slo_ms", -1, "plan.json: slo_ms: expected a positive number of ms (the plan's SLO)"),
        ("slo_ms", "200", "plan.json: slo_ms: expected a positive number of ms (the plan's SLO)"),
        ("slo_ms", True, "plan.json: slo_ms: expected a positive number of ms (the plan's SLO)"),
    ],
)
def test_bad_recorded_model_or_slo_is_named(
    cluster: Cluster, doc: dict[str, Any], key: str, value: object, expected: str
) -> None:
    with pytest.raises(InputError) as info:
        plan_from_json({**doc, key: value}, one_block("cyclegan"), cluster, "plan.json")
    assert str(info.value).startswith(expected)


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("plan", "plan.json: pipeline: expected only the keys model, slo_ms, share"),
        ("pipeline", "plan.json: pipelines[0].partition: expected only the keys model, gpus"),
        ("partition", "plan.json: pipelines[0].partitions[0].worker: expected only the keys"),
    ],
)
def test_a_misspelt_key_is_named_at_every_level(
    cluster: Cluster, doc: dict[str, Any], where: str, message: str
) -> None:
    """A misspelt key would be read as missing, or ignored: each level names it, and the key
    meant ("pipelines", "partitions", "workers")."""
    bad = json.loads(json.dumps(doc))
    if where == "plan":
        bad["pipeline"] = bad.pop("pipelines")
    elif where == "pipeline":
        bad["pipelines"][0]["partition"] = bad["pipelines"][0].pop("partitions")
    else:
        bad["pipelines"][0]["partitions"][0]["worker"] = 1
    with pytest.raises(InputError) as info:
        plan_from_json(bad, one_block("cyclegan"), cluster, "plan.json")
    assert str(info.value).startswith(message)
    assert "did you mean" in str(info.value)


def test_a_cluster_given_as_the_plan_is_named_so(cluster: Cluster) -> None:
    """`pipeline sim --plan cluster.json` said "the plan serves nothing"."""
    cluster_doc = {"gpus": {"A": {"count": 2, "per_server": 2}}, "nic_gbps": 10}
    with pytest.raises(InputError) as info:
        plan_from_json(cluster_doc, one_block("cyclegan"), cluster, "c.json")
    assert str(info.value) == (
        "c.json: expected a pipeline plan (`pipeline plan --json`), not a cluster's description"
    )


def test_a_multi_model_plan_exposes_that_models_slo(cluster: Cluster, doc: dict[str, Any]) -> None:
    old = {k: v for k, v in doc.items() if k not in ("model", "slo_ms")}
    many = {"models": {"cyclegan": {"share": 1.0, "slo_ms": 42.0, **old}}}
    assert plan_from_json(many, one_block("cyclegan"), cluster).slo_ms == 42.0


def test_a_run_in_which_no_request_arrives_is_refused(cluster: Cluster, plan: PipelinePlan) -> None:
    profiles = one_block("cyclegan")
    with pytest.raises(InputError) as info:
        run_plane(
            profiles, cluster, plan, SLO_MS, "ppipe", "poisson", 1.0, 1e-9,
            np.random.default_rng(0),
        )  # fmt: skip
    assert str(info.value).startswith(
        "--duration-s: expected a run in which requests arrive (none arrived in 1e-09 s at "
    )
    res = run_plane(
        profiles, cluster, plan, SLO_MS, "ppipe", "poisson", 1.0, 0.2, np.random.default_rng(0)
    )
    assert res.requests > 0 and 0.0 <= res.attainment <= 1.0

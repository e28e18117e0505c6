"""Placement on the operator side, without a server: what is refused before anything is created,
the status that says so, and the worst-link metric."""

from __future__ import annotations

from typing import Any

import pytest

from kuberl.spec import validate_manifest
from kuberl_operator import conditions
from kuberl_operator.metrics import Metrics
from kuberl_operator.placement import static_problems
from kuberl_operator.status import infeasible_status

T0 = "2026-01-01T00:00:00Z"


def job(placement: dict[str, Any] | None = None, **roles: Any):
    return validate_manifest({
        "apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
        "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "m.n:f"},
                 "placement": placement or {}, "roles": roles, "trainer": {"microBatchSize": 1}},
    })


def fields(problems) -> list[str]:
    return [p.field for p in problems]


def test_a_replica_bigger_than_any_node_is_refused_under_required() -> None:
    big = {"actor": {"gpus": 16}, "critic": {"gpus": 4}}
    problems = static_problems(job({"policy": "required"}, **big), max_gpus_per_node=8)
    assert fields(problems) == ["spec.roles.actor.gpus"]
    assert "role actor needs 16 GPUs per replica" in problems[0].message
    assert "--max-gpus-per-node" in problems[0].message
    assert str(problems[0]).startswith("spec.roles.actor.gpus: role actor")
    assert static_problems(job({"policy": "required"}, **big), max_gpus_per_node=16) == []
    # preferred: nothing is refused here (the pods stay Pending; the driver reports links it finds).
    assert static_problems(job({"policy": "preferred"}, **big), max_gpus_per_node=8) == []


@pytest.mark.parametrize("placement, roles, expected", [
    # No DRA attribute marks NVLink: NV cannot be asked of the scheduler.
    ({"mode": "dra", "minLink": "NV"}, {"actor": {"gpus": 2}}, ["spec.placement.minLink"]),
    ({"mode": "dra", "minLink": "NV", "draConstraint": "numaNode"}, {"actor": {"gpus": 2}}, ["spec.placement.minLink"]),
    # numaNode admits NODE links: a PCIe level needs pcieRoot.
    ({"mode": "dra", "minLink": "PHB", "draConstraint": "numaNode"}, {"actor": {"gpus": 2}},
     ["spec.placement.draConstraint"]),
    ({"mode": "dra", "minLink": "NODE", "draConstraint": "numaNode"}, {"actor": {"gpus": 2}}, []),
    ({"mode": "dra", "minLink": "PIX", "draConstraint": "pcieRoot"}, {"actor": {"gpus": 2}}, []),
    # The device plugin asks nothing of the scheduler: the driver checks NV at start.
    ({"mode": "device-plugin", "minLink": "NV"}, {"actor": {"gpus": 2}}, []),
    # One GPU per replica has no link inside a replica.
    ({"mode": "dra", "minLink": "NV"}, {"actor": {"gpus": 1}, "critic": {"gpus": 1}}, []),
])
def test_dra_must_be_able_to_ask_for_the_required_link(placement, roles, expected) -> None:
    problems = static_problems(job({"policy": "required", **placement}, **roles), max_gpus_per_node=8)
    assert fields(problems) == expected
    if problems:
        assert "role actor" in problems[0].message
    assert static_problems(job({"policy": "preferred", **placement}, **roles), max_gpus_per_node=8) == []


def test_every_problem_is_reported_with_the_roles_named() -> None:
    problems = static_problems(job({"policy": "required", "mode": "dra", "minLink": "NV"},
                                   actor={"gpus": 16}, critic={"gpus": 2}, ref={"gpus": 4}), max_gpus_per_node=8)
    assert fields(problems) == ["spec.roles.actor.gpus", "spec.placement.minLink"]
    assert "roles actor, critic, ref" in problems[1].message


def test_infeasible_status_is_terminal_and_names_the_fields() -> None:
    st = infeasible_status({}, 2, "spec.roles.actor.gpus: role actor needs 16 GPUs", T0)
    assert st["phase"] == "Failed" and st["observedGeneration"] == 2
    degraded = conditions.find(st["conditions"], "PlacementDegraded")
    failed = conditions.find(st["conditions"], "Failed")
    assert (degraded["status"], degraded["reason"]) == ("True", "Infeasible")
    assert (failed["status"], failed["reason"]) == ("True", "PlacementDegraded")
    assert "spec.roles.actor.gpus" in failed["message"] and conditions.terminal(st["conditions"]) == "Failed"
    assert conditions.find(st["conditions"], "Ready")["status"] == "False"


def sample(text: str, name: str) -> dict[tuple, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1:].rsplit("} ", 1)
            pairs = (part.split("=", 1) for part in labels.split(","))
            out[tuple(sorted(key + "=" + val.strip('"') for key, val in pairs))] = float(value)
    return out


def test_worst_link_metric_follows_the_status() -> None:
    from prometheus_client import generate_latest

    m = Metrics()
    m.observe("ns", "j", {"phase": "Running", "roles": {"actor": {"worstLink": "NV18"}, "critic": {"worstLink": "PXB"},
                                                         "ref": {"worstLink": "bogus"}, "reward": {}}})
    got = sample(generate_latest(m.registry).decode(), "kuberl_operator_role_worst_link_score")
    assert got == {("job=j", "level=NV18", "namespace=ns", "role=actor"): 23.0,
                   ("job=j", "level=PXB", "namespace=ns", "role=critic"): 4.0}
    # A new report replaces the level (no stale series); a deleted job's series go.
    m.observe("ns", "j", {"roles": {"actor": {"worstLink": "SYS"}}})
    got = sample(generate_latest(m.registry).decode(), "kuberl_operator_role_worst_link_score")
    assert got == {("job=j", "level=SYS", "namespace=ns", "role=actor"): 1.0}
    m.forget("ns", "j")
    assert sample(generate_latest(m.registry).decode(), "kuberl_operator_role_worst_link_score") == {}

"""`kuberl validate --cluster`'s rules on what the cluster said (cluster_check.problems); what the real stack says
is tests/cluster/test_validate_cluster.py. Here the cases that stack cannot show: no CRD, another kuberl's CRD, no
or an old KubeRay, a stale operator Lease, taints and affinity."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from kuberl.spec import generate_crd, validate_manifest
from kuberl_operator import cluster_check
from kuberl_operator.cluster_check import Facts, affinity_allows, problems, renewed_within, tolerated, unfit

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
JOB = validate_manifest({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
                         "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "kuberl.rewards:f"},
                                  "roles": {"actor": {"gpus": 1}}}})


def lease(renewed: datetime, holder: str = "op-1") -> dict:
    return {"metadata": {"name": "kuberl", "namespace": "kuberl-system",
                         "annotations": {"kuberl.io/operator-version": "0.1.0"}},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                     "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}


def kuberay_crd(spec_fields: list[str]) -> dict:
    return {"spec": {"versions": [{"name": "v1", "served": True, "schema": {"openAPIV3Schema": {"properties": {
        "spec": {"properties": {k: {} for k in spec_fields}}}}}}]}}


def node(name: str = "n", taints: list | None = None, labels: dict | None = None, **allocatable: str) -> dict:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": taints or []},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "ephemeral-storage": "1Ti",
                                       "nvidia.com/gpu": "8", **allocatable}}}


def healthy() -> Facts:
    cluster = next(o for o in cluster_check.builders.runtime_objects(JOB, cluster_check.builders.BuildOptions("ns"))
                   if o["kind"] == "RayCluster")
    return Facts("ns", crd=generate_crd(), leases=[lease(NOW)], kuberay_crd=kuberay_crd(list(cluster["spec"])),
                 nodes=[node(taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
                        node("cpu")], now=NOW)


def test_a_healthy_cluster_has_no_problems() -> None:
    assert problems(JOB, healthy()) == []


def test_no_crd_is_one_line_and_no_dry_run_guess() -> None:
    facts = healthy()
    facts.crd, facts.dry_run = None, (404, "the server could not find the requested resource")
    assert problems(JOB, facts) == [
        "CRD rltrainingjobs.kuberl.io is not installed: install the chart (helm install kuberl charts/kuberl) or "
        "`kuberl crd | kubectl apply --server-side -f -`"]


def test_another_kuberls_crd_is_named() -> None:
    facts = healthy()
    facts.crd = copy.deepcopy(facts.crd)
    facts.crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"].pop("image")
    [line] = problems(JOB, facts)
    assert line.startswith("CRD rltrainingjobs.kuberl.io is another kuberl's")


def test_kuberay_absent_or_too_old() -> None:
    facts = healthy()
    facts.kuberay_crd = None
    assert problems(JOB, facts) == [
        "KubeRay is not installed (no CRD rayclusters.ray.io): install its operator, v1.5.0 or later"]
    facts.kuberay_crd = kuberay_crd(["headGroupSpec"])
    [line] = problems(JOB, facts)
    assert line.startswith("KubeRay's RayCluster CRD lacks spec.") and "upgrade KubeRay to v1.5.0" in line


@pytest.mark.parametrize("age,ok", [(timedelta(seconds=29), True), (timedelta(seconds=31), False)])
def test_an_operator_lease_counts_while_renewed_within_two_durations(age: timedelta, ok: bool) -> None:
    assert renewed_within(lease(NOW - age), NOW) is ok
    assert not renewed_within(lease(NOW, holder=""), NOW), "a released Lease: no operator"
    seconds_only = lease(NOW)
    seconds_only["spec"]["renewTime"] = "2026-12-06T12:00:00Z"
    assert renewed_within(seconds_only, NOW)
    seconds_only["spec"]["renewTime"] = "yesterday"
    assert not renewed_within(seconds_only, NOW)


def test_a_refused_read_is_a_note_not_a_problem() -> None:
    facts = healthy()
    facts.nodes, facts.leases = [], []
    facts.unreadable = {"nodes": "403 forbidden", "Leases": "403 forbidden"}
    assert problems(JOB, facts) == []
    assert cluster_check.notes(facts) == ["not checked: Leases could not be read (403 forbidden)",
                                          "not checked: nodes could not be read (403 forbidden)"]


def test_condition_taints_do_not_count_but_purpose_taints_and_cordons_do() -> None:
    pod, need = {"containers": []}, {"cpu": Decimal(1)}
    assert unfit(pod, need, node(taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}])) is None
    assert "taint dedicated:NoSchedule" in unfit(pod, need, node(taints=[{"key": "dedicated", "effect": "NoSchedule"}]))
    assert unfit(pod, need, {**node(), "spec": {"unschedulable": True}}) == "n is cordoned"
    assert unfit(pod, {"nvidia.com/gpu": Decimal(9)}, node()) == "n has nvidia.com/gpu 8 allocatable"


def test_tolerations_match_as_the_scheduler_matches_them() -> None:
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    assert tolerated(taint, [{"operator": "Exists"}])
    assert tolerated(taint, [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}])
    assert tolerated(taint, [{"key": "k", "operator": "Equal", "value": "v"}])
    assert not tolerated(taint, [{"key": "k", "operator": "Equal", "value": "w"}])
    assert not tolerated(taint, [{"key": "k", "operator": "Exists", "effect": "NoExecute"}])


def test_required_node_affinity_is_any_term_of_all_expressions() -> None:
    pod = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                              {"key": "spot", "operator": "DoesNotExist"}]},
        {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}]}}}}
    assert affinity_allows(pod, {"zone": "a"})
    assert not affinity_allows(pod, {"zone": "a", "spot": "1"})
    assert affinity_allows(pod, {"pool": "x", "spot": "1"})
    assert not affinity_allows(pod, {"zone": "b"})

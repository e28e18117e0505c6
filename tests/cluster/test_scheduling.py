"""Per-role placement on the real stack: kwok nodes with different GPU models and taints; each role's
pods land only on the nodes its spec allows (the real kube-scheduler decides), and a role that no node
fits shows in the job's status and Events with the scheduler's own reason."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from localkube.api import NODES, RLTJ, Api
from localkube.nodes import GPU_TAINT, gpu_node
from localkube.stack import Cluster

from .jobs import condition, describe, events, manifest, pods_of, running, status
from .operator_process import OperatorProcess
from .waits import wait_for

pytestmark = pytest.mark.netns

POOL = {"key": "kuberl.io/test-pool", "value": "placement", "effect": "NoSchedule"}  # keeps other tests' pods off
LEGACY = {"key": "pool", "value": "legacy", "effect": "NoSchedule"}
A100, L4 = "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4"
PRIORITY, RUNTIME = "scheduling.k8s.io/v1/priorityclasses", "node.k8s.io/v1/runtimeclasses"


def tolerate(*taints: dict[str, str]) -> list[dict[str, str]]:
    return [{"key": t["key"], "operator": "Equal", "value": t["value"], "effect": t["effect"]} for t in taints]


@pytest.fixture(scope="module")
def hetero(cluster: Cluster, admin: Api) -> Iterator[dict[str, str]]:
    """Two more GPU nodes beside the session's H200s (gpu-0..3): A100s, and L4s in a tainted legacy pool;
    a PriorityClass and a RuntimeClass for the pods to name. Node name -> GPU product."""
    nodes = {"a100-0": A100, "l4-0": L4}
    cluster.add_nodes([gpu_node("a100-0", product=A100, taints=(GPU_TAINT, POOL)),
                       gpu_node("l4-0", product=L4, taints=(GPU_TAINT, POOL, LEGACY))])
    admin.create(PRIORITY, {"metadata": {"name": "kuberl-test-high"}, "value": 100000}, namespace=None)
    admin.create(RUNTIME, {"metadata": {"name": "kuberl-test"}, "handler": "runc"}, namespace=None)
    yield nodes
    for name in nodes:
        admin.delete(NODES, name, namespace=None)
    admin.delete(PRIORITY, "kuberl-test-high", namespace=None)
    admin.delete(RUNTIME, "kuberl-test", namespace=None)


def nodes_of(ns: Api, job: str, role: str) -> set[str]:
    return {p["spec"].get("nodeName") for p in pods_of(ns, job, role)}


def test_each_roles_pods_land_only_on_the_nodes_its_spec_allows(
    ns: Api, operator: OperatorProcess, hetero: dict[str, str], job_name: str
) -> None:
    roles = {
        "actor": {"gpuProduct": "NVIDIA-H200", "priorityClassName": "kuberl-test-high",
                  "runtimeClassName": "kuberl-test"},
        "critic": {"gpuProduct": A100, "tolerations": tolerate(POOL)},
        "ref": {"gpuProduct": L4, "tolerations": tolerate(POOL, LEGACY)},
        "reward": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["cpu-1"]}]}]}}}},
    }
    ns.create(RLTJ, manifest(job_name, roles=roles), strict=True)
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 120, "phase Running", ctx)
    assert nodes_of(ns, job_name, "actor") <= {f"gpu-{i}" for i in range(4)}, ctx()
    assert nodes_of(ns, job_name, "critic") == {"a100-0"}, ctx()
    assert nodes_of(ns, job_name, "ref") == {"l4-0"}, ctx()
    assert nodes_of(ns, job_name, "reward") == {"cpu-1"}, ctx()
    actor = pods_of(ns, job_name, "actor")
    assert len(actor) == 2 and running(actor)
    assert {(p["spec"]["priorityClassName"], p["spec"]["priority"], p["spec"]["runtimeClassName"]) for p in actor} == {
        ("kuberl-test-high", 100000, "kuberl-test")}
    assert all("unschedulable" not in r for r in status(ns, job_name)["roles"].values())


def test_a_role_no_node_fits_says_which_role_waits_and_why(
    ns: Api, operator: OperatorProcess, hetero: dict[str, str], job_name: str
) -> None:
    # The L4 pool is tainted: a ref that asks for L4s without tolerating the taint fits no node.
    ns.create(RLTJ, manifest(job_name, roles={"ref": {"gpuProduct": L4, "tolerations": tolerate(POOL)}}), strict=True)
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
    waits = wait_for(lambda: status(ns, job_name).get("roles", {}).get("ref", {}).get("unschedulable"), 90,
                     "the ref's unschedulable reason in status", ctx)
    # The scheduler's words, from the pod's PodScheduled condition: nodes tried, and why each was refused.
    assert waits.startswith("1 pod unschedulable: 0/") and "untolerated taint" in waits, waits
    assert "node affinity/selector" in waits, waits
    ready = wait_for(lambda: (c := condition(ns, job_name, "Ready")) and c["reason"] == "RoleUnschedulable" and c,
                     30, "Ready reason RoleUnschedulable", ctx)
    assert ready["status"] == "False" and ready["message"].startswith("role ref waits for a node: 1 pod"), ready
    assert status(ns, job_name)["phase"] == "Provisioning"
    (event,) = wait_for(lambda: events(ns, job_name, "RoleUnschedulable"), 30, "a RoleUnschedulable Event", ctx)
    assert event["type"] == "Warning" and event["message"].startswith("role ref waits for a node: "), event
    # Only the ref waits: the other roles were scheduled and run.
    for role in ("actor", "critic", "reward"):
        wait_for(lambda r=role: running(pods_of(ns, job_name, r)), 60, f"{role} Running", ctx)
        assert "unschedulable" not in status(ns, job_name)["roles"][role]
    # Fix the spec's cause (tolerate the legacy pool) on a fresh job: it runs there.
    fixed = f"{job_name}-ok"
    ns.create(RLTJ, manifest(fixed, roles={"ref": {"gpuProduct": L4, "tolerations": tolerate(POOL, LEGACY)}}))
    wait_for(lambda: status(ns, fixed).get("phase") == "Running", 120, "the fixed job Running",
             lambda: describe(ns, fixed) + operator.tail(30))
    assert nodes_of(ns, fixed, "ref") == {"l4-0"}

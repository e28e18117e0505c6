"""Per-role placement on Kubernetes: the spec's scheduling fields in each role's worker group, and a role
that no node fits reported in status and Events with the scheduler's reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kuberl.spec import load_manifest, validate_manifest
from kuberl_operator import builders
from kuberl_operator.health import PodView, pod_view
from kuberl_operator.status import Observed, decide, later

from .schemas import CrdSchema

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
OPTS = builders.BuildOptions(namespace="ml", image="runtime:1")
T1, T2 = "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"
WAIT = "0/6 nodes are available: 6 node(s) didn't match Pod's node affinity/selector."


def manifest(**roles: Any) -> dict[str, Any]:
    return {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
            "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "m.n:f"},
                     "trainer": {"microBatchSize": 1}, "roles": roles}}


def groups(**roles: Any) -> dict[str, dict[str, Any]]:
    """Each worker group's pod spec, by role."""
    cluster = builders.ray_cluster(validate_manifest(manifest(**roles)), OPTS)
    return {g["groupName"]: g["template"]["spec"] for g in cluster["spec"]["workerGroupSpecs"]}


AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]},
                          {"key": "spot", "operator": "DoesNotExist"}]}]}},
    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                           "labelSelector": {"matchLabels": {"kuberl.io/role": "critic"}}}}]}}


def test_each_roles_fields_land_in_its_own_worker_group(validator) -> None:
    roles = {
        "actor": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3", "nodeSelector": {"pool": "train"},
                  "priorityClassName": "training-high", "runtimeClassName": "nvidia"},
        "critic": {"gpus": 1, "affinity": AFFINITY},
        "ref": {"gpus": 1, "tolerations": [{"key": "pool", "value": "legacy", "effect": "NoSchedule"},
                                           {"key": "spot", "operator": "Exists"}]},
    }
    pods = groups(**roles)
    assert pods["actor"]["nodeSelector"] == {"pool": "train", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pods["actor"]["priorityClassName"] == "training-high" and pods["actor"]["runtimeClassName"] == "nvidia"
    assert pods["critic"]["affinity"] == AFFINITY  # as written: defaults are not added
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert pods["ref"]["tolerations"] == [gpu, {"key": "pool", "operator": "Equal", "value": "legacy",
                                                "effect": "NoSchedule"}, {"key": "spot", "operator": "Exists"}]
    # Nothing leaks across roles; a CPU role without fields gets no scheduling keys at all.
    assert "affinity" not in pods["actor"] and "nodeSelector" not in pods["critic"]
    assert pods["critic"]["tolerations"] == [gpu]
    fields = {"nodeSelector", "tolerations", "affinity", "priorityClassName", "runtimeClassName"}
    assert not fields & set(pods["reward"])
    # KubeRay's schema accepts the RayCluster; ours accepts the job (the API server prunes nothing).
    job = validate_manifest(manifest(**roles))
    assert validator(builders.ray_cluster(job, OPTS)) == []
    assert validator(manifest(**roles)) == []


def test_the_heterogeneous_example_renders_valid_objects(validator) -> None:
    path = EXAMPLES / "ppo-hetero.yaml"
    job = load_manifest(path)
    objs = builders.all_objects(job, yaml.safe_load(path.read_text())["spec"], "token", OPTS)
    assert [p for o in objs for p in validator(o)] == []
    pods = {g["groupName"]: g["template"]["spec"] for g in builders.ray_cluster(job, OPTS)["spec"]["workerGroupSpecs"]}
    assert {r: p.get("nodeSelector", {}).get("nvidia.com/gpu.product") for r, p in pods.items()} == {
        "actor": "NVIDIA-H100-80GB-HBM3", "critic": "NVIDIA-A100-SXM4-80GB", "ref": "NVIDIA-L4", "reward": None}
    assert pods["actor"]["priorityClassName"] == "training-high" and "affinity" in pods["reward"]


def test_the_crd_refuses_what_the_model_refuses() -> None:
    """The API server checks the scheduling fields' shapes too (the generated schema)."""
    from kuberl.spec import generate_crd

    schema = CrdSchema(generate_crd(), "v1alpha1")
    bad = manifest(ref={"tolerations": [{"key": "a", "operator": "Maybe"}]})
    assert any("tolerations" in p and "Maybe" in p for p in schema.problems(bad))
    typo = manifest(ref={"affinity": {"nodeAfinity": {}}})
    assert any("nodeAfinity" in p for p in schema.problems(typo))


def waiting_pods(cluster: str = "rc") -> tuple[PodView, ...]:
    """Ready pods, but the ref's pod waits for a node."""
    return tuple(PodView(name=n, uid=f"u-{n}", role=role, owner=cluster, ready=role != "ref", failure=None,
                         deleting=False, unschedulable=WAIT if role == "ref" else None)
                 for role, n in (("actor", "a0"), ("critic", "c0"), ("ref", "r0"), ("reward", "w0")))


def test_a_role_that_no_node_fits_names_the_role_and_the_schedulers_reason(validator) -> None:
    job = validate_manifest(manifest(ref={"gpus": 1, "gpuProduct": "NVIDIA-B200"}))
    first = decide(job, 1, {}, Observed("rc", waiting_pods()), T1)
    st = first.status
    assert st["phase"] == "Provisioning"
    assert st["roles"]["ref"]["unschedulable"] == f"1 pod unschedulable: {WAIT}"
    assert "unschedulable" not in st["roles"]["actor"]
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "RoleUnschedulable" and ready["message"] == (
        f"role ref waits for a node: 1 pod unschedulable: {WAIT} (since {T1}; the driver gives up at "
        f"{later(T1, 1800)}, spec.resilience.startTimeoutSeconds 1800s after)")
    assert st["roles"]["ref"]["unschedulableSince"] == T1 and later(T1, 1800) == "2026-01-01T00:31:00Z"
    assert [(e.type, e.reason, e.message) for e in first.events] == [
        ("Warning", "RoleUnschedulable", f"role ref waits for a node: 1 pod unschedulable: {WAIT}")]
    body = {**manifest(ref={"gpus": 1, "gpuProduct": "NVIDIA-B200"}), "status": st}
    assert validator(body) == []  # the CRD declares the field: a real API server keeps it
    # Still waiting: no second Event. Scheduled and ready: the field goes and the job runs.
    still = decide(job, 1, st, Observed("rc", waiting_pods()), T2)
    assert still.events == () and still.status["roles"]["ref"]["unschedulableSince"] == T1  # since it began
    ready_pods = tuple(PodView(p.name, p.uid, p.role, p.owner, True, None, False) for p in waiting_pods())
    after = decide(job, 1, st, Observed("rc", ready_pods), T2).status
    assert after["phase"] == "Running" and "unschedulable" not in after["roles"]["ref"]
    assert "unschedulableSince" not in after["roles"]["ref"]


def test_the_schedulers_reason_comes_from_the_pods_podscheduled_condition() -> None:
    def pod(phase: str, *conds: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"name": "p", "uid": "u", "labels": {"kuberl.io/role": "ref"}},
                "status": {"phase": phase, "conditions": list(conds)}}

    stuck = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": WAIT}
    assert pod_view(pod("Pending", stuck)).unschedulable == WAIT
    gated = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated", "message": "gated"}
    assert pod_view(pod("Pending", gated)).unschedulable is None
    assert pod_view(pod("Pending", {"type": "PodScheduled", "status": "True"})).unschedulable is None
    assert pod_view(pod("Pending")).unschedulable is None

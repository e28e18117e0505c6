"""The operator's scenarios on a real cluster: kind, KubeRay, real pods (`make e2e`).

Same scenarios as tests/operator, but KubeRay makes the pods, the kubelet runs them, garbage
collection works, and failures are real deletions.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from tests.cluster.operator_process import OperatorProcess
from tests.cluster.waits import wait_for

from .conftest import Kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("operator")]
POD_TIMEOUT = 300  # scheduling, image already loaded, `ray start`


def manifest(name: str, **roles: Any) -> dict[str, Any]:
    small = {"cpu": "500m", "memory": "1Gi"}
    base = {role: {"replicas": 1, "resources": small} for role in ("actor", "critic", "ref", "reward")}
    base["critic"]["replicas"] = 2
    for role, overrides in roles.items():
        base[role] = {**base[role], **overrides}
    return {
        "apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": name},
        "spec": {"model": {"builtin": "tiny"}, "data": {"task": "repeat-letter", "batchSize": 16},
                 "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
                 "rollout": {"maxNewTokens": 8}, "trainer": {"steps": 1000, "miniBatchSize": 16, "microBatchSize": 8},
                 "roles": base},
    }


def status(k: Kubectl, name: str) -> dict[str, Any]:
    return (k.get("rltj", name) or {}).get("status") or {}


def condition(k: Kubectl, name: str, type_: str) -> dict[str, Any] | None:
    return next((c for c in status(k, name).get("conditions", []) if c["type"] == type_), None)


def worker_pods(k: Kubectl, name: str, role: str | None = None) -> list[dict[str, Any]]:
    selector = f"kuberl.io/job={name}" + (f",kuberl.io/role={role}" if role else ",kuberl.io/role")
    return [p for p in k.list("pods", selector) if not p["metadata"].get("deletionTimestamp")]


def running(k: Kubectl, op: OperatorProcess, name: str, **roles: Any) -> list[dict[str, Any]]:
    k.apply(manifest(name, **roles))
    wait_for(lambda: status(k, name).get("phase") == "Running", POD_TIMEOUT, f"{name} Running", op.tail, interval=2)
    return worker_pods(k, name)


def test_create_gives_a_raycluster_and_a_driver(kubectl: Kubectl, operator: OperatorProcess) -> None:
    running(kubectl, operator, "e2e-create")
    cluster = kubectl.get("raycluster", "e2e-create")
    assert [g["groupName"] for g in cluster["spec"]["workerGroupSpecs"]] == ["actor", "critic", "ref", "reward"]
    assert kubectl.get("job", "e2e-create-driver") is not None
    assert {r: s["ready"] for r, s in status(kubectl, "e2e-create")["roles"].items()} == {"actor": 1, "critic": 2,
                                                                                          "ref": 1, "reward": 1}


def test_invalid_spec_is_reported(kubectl: Kubectl, operator: OperatorProcess) -> None:
    bad = manifest("e2e-invalid")
    bad["spec"]["algorithm"] = {"name": "grpo", "groupSize": 1}
    kubectl.apply(bad)
    wait_for(lambda: condition(kubectl, "e2e-invalid", "Failed"), 60, "Failed", operator.tail, interval=1)
    cond = condition(kubectl, "e2e-invalid", "Failed")
    assert cond["reason"] == "InvalidSpec" and "spec.algorithm.groupSize" in cond["message"]


def test_a_failed_critic_restarts_only_the_critic(kubectl: Kubectl, operator: OperatorProcess) -> None:
    pods = running(kubectl, operator, "e2e-critic")
    others = {p["metadata"]["uid"] for p in pods if p["metadata"]["labels"]["kuberl.io/role"] != "critic"}
    old = {p["metadata"]["uid"] for p in pods} - others
    kubectl.delete("pod", worker_pods(kubectl, "e2e-critic", "critic")[0]["metadata"]["name"])
    wait_for(lambda: status(kubectl, "e2e-critic")["roles"]["critic"]["restarts"] == 1, 60, "restarts = 1",
             operator.tail, interval=1)
    wait_for(lambda: status(kubectl, "e2e-critic").get("phase") == "Running", POD_TIMEOUT, "Running again",
             operator.tail, interval=2)
    now = worker_pods(kubectl, "e2e-critic")
    assert not old & {p["metadata"]["uid"] for p in now}
    assert others == {p["metadata"]["uid"] for p in now if p["metadata"]["labels"]["kuberl.io/role"] != "critic"}


def test_an_exhausted_budget_fails_the_job(kubectl: Kubectl, operator: OperatorProcess) -> None:
    running(kubectl, operator, "e2e-budget", ref={"maxRestarts": 0})
    kubectl.delete("pod", worker_pods(kubectl, "e2e-budget", "ref")[0]["metadata"]["name"])
    wait_for(lambda: status(kubectl, "e2e-budget").get("phase") == "Failed", 60, "Failed", operator.tail, interval=1)
    assert condition(kubectl, "e2e-budget", "Failed")["reason"] == "ReachedMaxRestarts"
    wait_for(lambda: kubectl.get("raycluster", "e2e-budget") is None, 120, "RayCluster deleted", operator.tail,
             interval=2)


def test_suspend_and_resume(kubectl: Kubectl, operator: OperatorProcess) -> None:
    running(kubectl, operator, "e2e-suspend")
    kubectl.patch("rltj", "e2e-suspend", {"spec": {"suspend": True}})
    wait_for(lambda: status(kubectl, "e2e-suspend").get("phase") == "Suspended", 60, "Suspended", operator.tail,
             interval=1)
    wait_for(lambda: not worker_pods(kubectl, "e2e-suspend"), 180, "worker pods gone", operator.tail, interval=2)
    assert kubectl.get("raycluster", "e2e-suspend") is None and kubectl.get("job", "e2e-suspend-driver") is None
    kubectl.patch("rltj", "e2e-suspend", {"spec": {"suspend": False}})
    wait_for(lambda: status(kubectl, "e2e-suspend").get("phase") == "Running", POD_TIMEOUT, "Running again",
             operator.tail, interval=2)
    assert status(kubectl, "e2e-suspend")["restarts"] == 0


def test_delete_removes_everything(kubectl: Kubectl, operator: OperatorProcess) -> None:
    running(kubectl, operator, "e2e-delete")
    kubectl.delete("rltj", "e2e-delete", wait=True)
    for kind, name in [("raycluster", "e2e-delete"), ("job", "e2e-delete-driver"), ("configmap", "e2e-delete-spec"),
                       ("configmap", "e2e-delete-progress"), ("secret", "e2e-delete-ray-auth"),
                       ("serviceaccount", "e2e-delete-driver")]:
        wait_for(lambda kind=kind, name=name: kubectl.get(kind, name) is None, 120, f"{kind} {name} deleted",
                 operator.tail, interval=2)


def test_operator_restart_adopts_what_exists(kubectl: Kubectl, operator: OperatorProcess) -> None:
    running(kubectl, operator, "e2e-restart")
    before = {p["metadata"]["uid"] for p in worker_pods(kubectl, "e2e-restart")}
    cluster = kubectl.get("raycluster", "e2e-restart")["metadata"]["uid"]
    operator.stop(signal.SIGKILL)
    operator.start(via="cli", timeout=60)
    wait_for(lambda: condition(kubectl, "e2e-restart", "Ready"), 60, "status after restart", operator.tail, interval=1)
    assert kubectl.get("raycluster", "e2e-restart")["metadata"]["uid"] == cluster
    assert len(kubectl.list("rayclusters", "kuberl.io/job=e2e-restart")) == 1
    assert len(kubectl.list("jobs", "kuberl.io/job=e2e-restart")) == 1
    assert {p["metadata"]["uid"] for p in worker_pods(kubectl, "e2e-restart")} == before
    assert status(kubectl, "e2e-restart")["restarts"] == 0

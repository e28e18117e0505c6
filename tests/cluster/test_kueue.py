"""Kueue (pinned, built from its Go module, started beside the stack with its webhooks) admits RLTrainingJobs as one
workload each: a job labelled kueue.x-k8s.io/queue-name gets a suspended RayCluster that Kueue admits with a pod
set for the head and each role; the job waits Pending while Kueue holds it, runs once admitted, and when Kueue
takes it back (here: its workload deactivated, as a preemption does) it goes back to Pending, counting no role
failure, and runs again when readmitted."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from localkube.api import CLUSTERQUEUES, LOCALQUEUES, RAYCLUSTERS, RESOURCEFLAVORS, RLTJ, WORKLOADS, Api
from localkube.stack import Cluster

from .faults import fail_pod
from .jobs import condition, describe, events, manifest, pods_of, status
from .operator_process import OperatorProcess
from .waits import wait_for

pytestmark = pytest.mark.netns

QUEUE = "kuberl-test-queue"
FLAVOR = "kuberl-test-flavor"
# waitForPodsReady as docs/operator.md recommends, its recovery shortened so that the test outlasts it: a role's
# restart on kwok takes seconds (on real pods tens of seconds: docs/performance.md)
PODS_READY = ("5m", "20s")
RECOVERY_S = 20


@pytest.fixture(scope="module")
def kueue(cluster: Cluster, admin: Api) -> Iterator[float]:
    """Kueue running (waitForPodsReady on), with a ClusterQueue whose GPU quota (6) holds one six-GPU job at a time;
    its start time."""
    seconds = cluster.start_kueue(PODS_READY)
    print(f"Kueue started in {seconds:.1f}s (CRDs, manager ready, webhooks)")
    admin.create(RESOURCEFLAVORS, {**kind("ResourceFlavor"), "metadata": {"name": FLAVOR}}, namespace=None)
    quota = {"cpu": "1000", "memory": "10Ti", "ephemeral-storage": "100Ti", "nvidia.com/gpu": "6"}
    admin.create(CLUSTERQUEUES, {**kind("ClusterQueue"), "metadata": {"name": QUEUE}, "spec": {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": list(quota), "flavors": [{"name": FLAVOR, "resources": [
            {"name": k, "nominalQuota": v} for k, v in quota.items()]}]}]}}, namespace=None)
    yield seconds
    admin.delete(CLUSTERQUEUES, QUEUE, namespace=None)
    admin.delete(RESOURCEFLAVORS, FLAVOR, namespace=None)
    cluster.stop_kueue()


def kind(name: str) -> dict[str, str]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": name}


def six_gpus(name: str) -> dict:
    job = manifest(name, roles={"actor": {"replicas": 1, "gpus": 4}, "critic": {"replicas": 1, "gpus": 1},
                                "ref": {"gpus": 1}})
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team"}
    return job


def workload_of(ns: Api, job: str) -> dict | None:
    """The Workload Kueue made for the job's RayCluster (its owner)."""
    return next((w for w in ns.list(WORKLOADS) if any(o["kind"] == "RayCluster" and o["name"] == job
                                                      for o in w["metadata"].get("ownerReferences", []))), None)


def admitted(workload: dict | None) -> bool:
    return bool(workload) and any(c["type"] == "Admitted" and c["status"] == "True"
                                  for c in (workload.get("status") or {}).get("conditions", []))


def test_kueue_admits_a_job_as_one_workload_holds_the_next_and_takes_one_back(
    ns: Api, operator: OperatorProcess, kueue: float, job_name: str
) -> None:
    ns.create(LOCALQUEUES, {**kind("LocalQueue"), "metadata": {"name": "team"}, "spec": {"clusterQueue": QUEUE}})
    first, second = f"{job_name}-a", f"{job_name}-b"
    ctx = lambda job: lambda: describe(ns, job) + operator.tail(40)  # noqa: E731
    ns.create(RLTJ, six_gpus(first), strict=True)
    wait_for(lambda: status(ns, first).get("phase") == "Running", 120, "the first job Running", ctx(first))
    work = workload_of(ns, first)
    assert admitted(work), work
    # one workload: the head and one pod set per worker group (actor, critic, ref, reward)
    assert sorted(p["name"] for p in work["spec"]["podSets"]) == ["actor", "critic", "head", "ref", "reward"]
    assert cond_of(ns, first, "Admitted") == ("True", "Admitted", "Kueue admitted its workload (LocalQueue team)")

    ns.create(RLTJ, six_gpus(second), strict=True)  # the quota holds one: Kueue keeps it suspended, whole
    wait_for(lambda: cond_of(ns, second, "Admitted")[1] == "Queued", 60, "the second job Queued", ctx(second))
    assert status(ns, second)["phase"] == "Pending" and "startTime" not in status(ns, second)
    assert ns.get(RAYCLUSTERS, second)["spec"]["suspend"] is True and not pods_of(ns, second)
    assert not admitted(workload_of(ns, second))

    # Kueue takes the first back (a preemption does the same: it suspends the RayCluster)
    ns.patch(WORKLOADS, workload_of(ns, first)["metadata"]["name"], {"spec": {"active": False}})
    wait_for(lambda: cond_of(ns, first, "Admitted")[1] == "Evicted", 60, "the first job Evicted", ctx(first))
    assert status(ns, first)["phase"] == "Pending"
    wait_for(lambda: not pods_of(ns, first), 60, "the first job's Ray pods gone", ctx(first))
    assert [e["reason"] for e in events(ns, first, "Evicted")] == ["Evicted"]
    assert status(ns, first).get("restarts", 0) == 0  # its pods went with the suspend: no role failed
    # ... and admits the second, which runs
    wait_for(lambda: status(ns, second).get("phase") == "Running", 120, "the second job Running", ctx(second))

    # readmitted once there is room again: the first runs once more
    ns.patch(WORKLOADS, workload_of(ns, first)["metadata"]["name"], {"spec": {"active": True}})
    ns.delete(RLTJ, second)
    wait_for(lambda: status(ns, first).get("phase") == "Running", 120, "the first job Running again", ctx(first))
    assert status(ns, first).get("restarts", 0) == 0


def cond_of(ns: Api, job: str, type_: str) -> tuple[str, str, str]:
    c = condition(ns, job, type_) or {}
    return c.get("status", ""), c.get("reason", ""), c.get("message", "")


def test_a_role_restart_keeps_the_workload_admitted_past_the_recovery_timeout(
    ns: Api, operator: OperatorProcess, kueue: float, job_name: str
) -> None:
    """Kueue's waitForPodsReady evicts a running workload whose PodsReady is False for longer than recoveryTimeout.
    For a RayCluster, PodsReady is KubeRay's status.state == ready, which KubeRay v1.5.0 sets once all pods run and
    leaves there until a suspend: a role's restart never turns it False, so the recovery timeout cannot trip on one
    (docs/operator.md). Shown here: one role's pod fails, the role restarts alone, PodsReady stays True throughout,
    and the workload is still admitted, never evicted or requeued, past the recovery timeout."""
    ns.create(LOCALQUEUES, {**kind("LocalQueue"), "metadata": {"name": "team"}, "spec": {"clusterQueue": QUEUE}})
    ctx = lambda: describe(ns, job_name) + operator.tail(40)  # noqa: E731
    ns.create(RLTJ, six_gpus(job_name), strict=True)
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 120, "the job Running", ctx)
    wait_for(lambda: pods_ready(workload_of(ns, job_name)), 60, "the workload's PodsReady", ctx)
    failed_at = time.monotonic()
    fail_pod(ns, pods_of(ns, job_name, "critic")[0]["metadata"]["name"], "exit")
    seen = []
    while time.monotonic() - failed_at < RECOVERY_S + 5:  # past the recovery timeout
        seen.append(pods_ready(workload_of(ns, job_name)))
        time.sleep(0.5)
    assert status(ns, job_name)["roles"]["critic"].get("restarts") == 1, ctx()
    assert status(ns, job_name)["phase"] == "Running", ctx()
    assert all(seen), seen  # never False: KubeRay's state stays ready through a role's restart
    work = workload_of(ns, job_name)
    assert admitted(work) and not any(c["type"] == "Evicted" and c["status"] == "True"
                                      for c in work["status"].get("conditions", [])), work["status"]
    assert not (work["status"].get("requeueState") or {}).get("count"), work["status"]
    assert not events(ns, job_name, "Evicted")


def pods_ready(workload: dict | None) -> bool:
    return bool(workload) and any(c["type"] == "PodsReady" and c["status"] == "True"
                                  for c in (workload.get("status") or {}).get("conditions", []))


def test_a_roles_kueue_topology_reaches_its_pod_set(ns: Api, operator: OperatorProcess, kueue: float,
                                                     job_name: str) -> None:
    """spec.roles.R.kueueTopology becomes Kueue's topology request of that role's pod set (and of no other)."""
    ns.create(LOCALQUEUES, {**kind("LocalQueue"), "metadata": {"name": "team"}, "spec": {"clusterQueue": QUEUE}})
    job = six_gpus(job_name)
    job["spec"]["roles"]["actor"]["kueueTopology"] = {"required": "example.com/rack"}
    job["spec"]["roles"]["critic"]["kueueTopology"] = {"preferred": "example.com/block"}
    ns.create(RLTJ, job, strict=True)
    work = wait_for(lambda: workload_of(ns, job_name), 60, "the job's Workload", lambda: describe(ns, job_name))
    requests = {p["name"]: p.get("topologyRequest") for p in work["spec"]["podSets"]}
    assert requests["actor"]["required"] == "example.com/rack", requests
    assert requests["critic"]["preferred"] == "example.com/block", requests
    assert not (requests["ref"] or {}).get("required") and not (requests["head"] or {}).get("required"), requests

"""Gang scheduling on the real stack (gang.py): two jobs that each need 60 % of a pool's GPUs. The first runs; the
second waits whole, every pod gated and none bound, with a condition saying which pod fits nowhere and why; when
the first ends, the second is let through and runs. Neither ever holds a part of its pods."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from localkube.api import NODES, PODS, RLTJ, Api
from localkube.nodes import GPU_TAINT, gpu_node
from localkube.stack import Cluster

from .jobs import condition, describe, manifest, status
from .operator_process import OperatorProcess
from .waits import wait_for

pytestmark = pytest.mark.netns

POOL = {"key": "kuberl.io/test-pool", "value": "gang", "effect": "NoSchedule"}  # keeps other tests' pods off
PRODUCT = "NVIDIA-GANG-TEST"
GATE = "kuberl.io/gang"


@pytest.fixture(scope="module")
def pool(cluster: Cluster, admin: Api) -> Iterator[list[str]]:
    """Two nodes of 5 GPUs each, tainted for this test's jobs only."""
    names = ["gang-0", "gang-1"]
    cluster.add_nodes([gpu_node(n, gpus=5, product=PRODUCT, taints=(GPU_TAINT, POOL)) for n in names])
    yield names
    for name in names:
        admin.delete(NODES, name, namespace=None)


def six_gpus(name: str) -> dict:
    """6 of the pool's 10 GPUs: an actor of 4, a critic of 1 and a ref of 1 (the reward, head and driver on CPU)."""
    toleration = [{"key": POOL["key"], "operator": "Equal", "value": POOL["value"], "effect": "NoSchedule"}]
    role = {"replicas": 1, "gpuProduct": PRODUCT, "tolerations": toleration}
    return manifest(name, roles={"actor": {**role, "gpus": 4}, "critic": {**role, "gpus": 1},
                                 "ref": {**role, "gpus": 1}})


def job_pods(ns: Api, job: str) -> list[dict]:
    """Every live pod of the job: the Ray head, the workers and the driver."""
    return [p for p in ns.list(PODS, f"kuberl.io/job={job}") if not p["metadata"].get("deletionTimestamp")]


def gated(pod: dict) -> bool:
    return any(g["name"] == GATE for g in pod["spec"].get("schedulingGates") or [])


def test_of_two_jobs_that_each_need_60_percent_one_runs_and_the_other_waits_whole(
    ns: Api, operator: OperatorProcess, pool: list[str], job_name: str
) -> None:
    first, second = f"{job_name}-a", f"{job_name}-b"
    ns.create(RLTJ, six_gpus(first), strict=True)
    ctx = lambda job: lambda: describe(ns, job) + operator.tail(40)  # noqa: E731
    wait_for(lambda: status(ns, first).get("phase") == "Running", 120, "the first job Running", ctx(first))
    ran = job_pods(ns, first)
    assert len(ran) == 6 and not any(gated(p) for p in ran), ctx(first)()  # head, 4 roles' pods, driver
    assert {p["spec"]["nodeName"] for p in ran if p["metadata"]["labels"].get("kuberl.io/role") in (
        "actor", "critic", "ref")} <= set(pool)

    ns.create(RLTJ, six_gpus(second), strict=True)
    ready = wait_for(lambda: (c := condition(ns, second, "Ready")) and c["reason"] == "GangWaiting" and c, 60,
                     "the second job's Ready reason GangWaiting", ctx(second))
    assert ready["status"] == "False", ready
    assert ready["message"].startswith("all 6 pods wait to be scheduled together: pod "), ready
    # the pod that found no room, what it asks, the room on the pool's nodes, and the nodes it may not use
    words = ("nvidia.com/gpu=", "fits no node's free capacity now (gang-0 has nvidia.com/gpu ",
             "other nodes not ready or ruled out by its selectors or tolerations)")
    assert all(w in ready["message"] for w in words), ready
    assert status(ns, second)["phase"] == "Pending"
    for _ in range(10):  # it stays whole: every pod made, gated, on no node (the critic and ref would fit alone)
        waiting = job_pods(ns, second)
        assert len(waiting) == 6 and all(gated(p) and not p["spec"].get("nodeName") for p in waiting), ctx(second)()
        time.sleep(0.5)
    assert status(ns, first)["phase"] == "Running"

    ns.delete(RLTJ, first)  # the first ends: its pods go, and the second is let through, whole
    wait_for(lambda: status(ns, second).get("phase") == "Running", 120, "the second job Running", ctx(second))
    ran = job_pods(ns, second)
    assert len(ran) == 6 and all(not gated(p) and p["spec"].get("nodeName") for p in ran), ctx(second)()
    assert condition(ns, second, "Ready")["reason"] == "AllRolesReady"

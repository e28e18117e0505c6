"""Whole-cluster events on the real stack: the Ray head pod failing restarts the whole Ray cluster (and counts
against no role); a pod whose node is lost (phase Unknown, or marked not ready by the node controller) is a
failure of its role."""

from __future__ import annotations

from typing import Any

import pytest
from localkube.api import PODS, RLTJ, SECRETS, Api

from .faults import fail_pod
from .jobs import ROLES, condition, describe, events, manifest, pods_of, running, status, uids
from .operator_process import OperatorProcess
from .waits import wait_for

pytestmark = pytest.mark.netns


def head_pods(ns: Api, job: str) -> list[dict[str, Any]]:
    return [p for p in pods_of(ns, job) if p["metadata"]["labels"].get("ray.io/node-type") == "head"]


def test_the_head_failing_restarts_the_whole_ray_cluster(ns: Api, operator: OperatorProcess, job_name: str) -> None:
    ns.create(RLTJ, manifest(job_name))
    ctx = lambda: describe(ns, job_name) + operator.tail(40)  # noqa: E731
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 90, "phase Running", ctx)
    assert status(ns, job_name)["head"]["ready"] is True
    before = uids(pods_of(ns, job_name))
    (head,) = head_pods(ns, job_name)
    fail_pod(ns, head["metadata"]["name"], "exit")

    st = wait_for(lambda: (s := status(ns, job_name))["head"]["restarts"] == 1 and s, 60, "a head restart", ctx)
    assert head["metadata"]["name"] in st["head"]["lastFailure"] and "exited with code 1" in st["head"]["lastFailure"]
    ready = condition(ns, job_name, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "RayHeadFailed", ready
    assert "whole Ray cluster restarts" in ready["message"]
    (event,) = wait_for(lambda: events(ns, job_name, "RayHeadFailed"), 30, "a RayHeadFailed Event", ctx)
    assert event["type"] == "Warning" and head["metadata"]["name"] in event["message"]

    # Every pod of the cluster, head and workers, is made anew; no role counts a restart.
    def renewed() -> bool:
        pods = pods_of(ns, job_name)
        return len(pods) == 1 + 2 + 2 + 1 + 1 and running(pods) and not uids(pods) & before

    wait_for(renewed, 150, "a new head and new pods for every role", ctx)
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 60, "Running again", ctx)
    st = status(ns, job_name)
    assert {r: s["restarts"] for r, s in st["roles"].items()} == dict.fromkeys(ROLES, 0)
    assert st["head"] == {**st["head"], "ready": True, "restarts": 1} and st["restarts"] == 1
    assert not events(ns, job_name, "RoleRestart")


def lose_node(ns: Api, pod: dict[str, Any], how: str) -> None:
    """What the control plane writes when a pod's node stops answering (kwok keeps every node's heartbeat, so
    the test writes it): phase Unknown, or the node controller's MarkPodsNotReady (Ready False, no reason)."""
    name = pod["metadata"]["name"]
    if how == "unknown":
        ns.patch(PODS, name, {"status": {"phase": "Unknown", "message": "the node stopped reporting"}}, sub="status")
        return
    conds = [c if c["type"] != "Ready" else {**c, "status": "False"} for c in pod["status"]["conditions"]]
    ns.patch(PODS, name, {"status": {"conditions": conds}}, sub="status")


@pytest.mark.parametrize("how, reason", [("unknown", "pod phase Unknown"), ("not-ready", "node NotReady")])
def test_a_pod_on_a_lost_node_counts_as_its_roles_failure(
    ns: Api, operator: OperatorProcess, job_name: str, how: str, reason: str
) -> None:
    ns.create(RLTJ, manifest(job_name))
    ctx = lambda: describe(ns, job_name) + operator.tail(40)  # noqa: E731
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 90, "phase Running", ctx)
    mine = pods_of(ns, job_name, "critic")
    lose_node(ns, mine[0], how)
    st = wait_for(lambda: (s := status(ns, job_name))["roles"]["critic"]["restarts"] == 1 and s, 60, "a restart", ctx)
    failure = st["roles"]["critic"]["lastFailure"]
    assert mine[0]["metadata"]["name"] in failure and f"node lost ({reason}" in failure, failure
    wait_for(lambda: running(p := pods_of(ns, job_name, "critic")) and len(p) == 2 and not uids(p) & uids(mine),
             120, "KubeRay's new critic pods", ctx)
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 60, "Running again", ctx)
    assert {r: s["restarts"] for r, s in status(ns, job_name)["roles"].items()} == {
        r: int(r == "critic") for r in ROLES
    }


def test_a_hand_deleted_ray_token_secret_comes_back_with_the_same_token(
    ns: Api, operator: OperatorProcess, job_name: str
) -> None:
    ns.create(RLTJ, manifest(job_name))
    ctx = lambda: describe(ns, job_name) + operator.tail(40)  # noqa: E731
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 90, "phase Running", ctx)
    name = f"{job_name}-ray-auth"
    old = ns.get(SECRETS, name)
    assert not old["metadata"].get("finalizers")  # nothing that would outlive the job
    ns.delete(SECRETS, name)
    new = wait_for(lambda: ns.get(SECRETS, name), operator.resync_seconds + 30, "the Secret made anew", ctx)
    assert new["metadata"]["uid"] != old["metadata"]["uid"] and new["data"] == old["data"]
    (kept,) = wait_for(lambda: events(ns, job_name, "RayTokenKept"), 30, "a RayTokenKept Event", ctx)
    assert name in kept["message"] and old["data"]["auth_token"] not in kept["message"]
    assert status(ns, job_name)["phase"] == "Running"

    # Deleted while the operator is away, the token is lost: a new one, and an Event saying the job must restart.
    operator.stop()
    try:
        ns.delete(SECRETS, name)
    finally:
        operator.start()
    (lost,) = wait_for(lambda: events(ns, job_name, "RayTokenLost"), operator.resync_seconds + 30, "RayTokenLost", ctx)
    assert lost["type"] == "Warning" and "suspend and resume" in lost["message"]
    assert wait_for(lambda: ns.get(SECRETS, name), 10, "the Secret made again")["data"] != old["data"]

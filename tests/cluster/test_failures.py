"""Per-role failure on the real stack: kwok reports a worker's death (or the pod or its node goes),
the operator restarts only that role's pods, KubeRay recreates them, the budget ends the job."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from localkube.api import NODES, RAYCLUSTERS, RLTJ, Api
from localkube.nodes import NodeSpec, gpu_node
from localkube.stack import Cluster

from .faults import HOWS, cordon, fail_pod
from .jobs import ROLES, condition, describe, events, manifest, others_of, pods_of, running, status, uids
from .operator_process import OperatorProcess
from .waits import wait_for

pytestmark = pytest.mark.netns
# What status.roles.R.lastFailure says; a pod whose node is gone is marked Failed by the pod GC, then deleted.
REASONS = {
    "exit": "exited with code 1",
    "oom": "OOMKilled",
    "evicted": "evicted",
    "deleted": "deleted",
    "node-deleted": "node no longer exists",
}


def replaced(ns: Api, job: str, role: str, before: set[str], replicas: int) -> list[dict[str, Any]] | None:
    """The role's pods once KubeRay has made all of them anew and kwok runs them."""
    pods = pods_of(ns, job, role)
    return pods if len(pods) == replicas and running(pods) and not uids(pods) & before else None


def spare_node(cluster: Cluster, role: str) -> str:
    name = f"spare-{role}-{secrets.token_hex(2)}"
    cluster.add_nodes([gpu_node(name) if role != "reward" else NodeSpec(name)])
    return name


@pytest.mark.parametrize("role", ROLES)
def test_a_role_fails_in_every_way_and_only_it_restarts(
    cluster: Cluster, ns: Api, admin: Api, operator: OperatorProcess, job_name: str, role: str
) -> None:
    ns.create(RLTJ, manifest(job_name, roles={role: {"maxRestarts": len(HOWS)}}))
    ctx = lambda: describe(ns, job_name) + operator.tail(40)  # noqa: E731
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 90, "phase Running", ctx)
    replicas = status(ns, job_name)["roles"][role]["desired"]
    for count, how in enumerate(HOWS, 1):
        spare, cordoned = None, []
        if how == "deleted":  # the new pods land on a node of their own, which `node-deleted` then deletes
            spare = spare_node(cluster, role)
            cordoned = [
                n["metadata"]["name"] for n in admin.list(NODES, namespace=None) if n["metadata"]["name"] != spare
            ]
            for node in cordoned:
                cordon(admin, node)
        try:
            others, mine = others_of(ns, job_name, role), pods_of(ns, job_name, role)
            victim = mine[0]["metadata"]["name"]
            fail_pod(ns, victim, how)
            st = wait_for(
                lambda count=count: (s := status(ns, job_name))["roles"][role]["restarts"] == count and s,
                150,
                f"restart {count} of {role} ({how})",
                ctx,
            )
            failure = st["roles"][role]["lastFailure"]
            # A lost node takes all of the role's pods (the gang was alone on it): any of them may be named.
            named = [victim] if how != "node-deleted" else [p["metadata"]["name"] for p in mine]
            assert any(n in failure for n in named) and REASONS[how] in failure, failure
            new = wait_for(
                lambda mine=mine: replaced(ns, job_name, role, uids(mine), replicas),
                120,
                f"KubeRay's new {role} pods after {how}",
                ctx,
            )
        finally:
            for node in cordoned:
                cordon(admin, node, False)
        if spare:
            assert {p["spec"]["nodeName"] for p in new} == {spare}
        assert others_of(ns, job_name, role) == others, f"pods of other roles were replaced when {role} was {how}"
        wait_for(lambda: status(ns, job_name).get("phase") == "Running", 60, f"Running again after {how}", ctx)
        assert {r: s["restarts"] for r, s in status(ns, job_name)["roles"].items()} == {
            r: count if r == role else 0 for r in ROLES
        }
        assert status(ns, job_name)["restarts"] == count
        restarts = wait_for(
            lambda count=count: (
                (e := events(ns, job_name, "RoleRestart")) and sum(x.get("count", 1) for x in e) == count and e
            ),
            30,
            f"{count} RoleRestart Events",
            ctx,
        )
        assert all(f"role {role}" in e["message"] for e in restarts)

    # One more is past the budget: Failed for good, and the GPUs are given back.
    fail_pod(ns, pods_of(ns, job_name, role)[0]["metadata"]["name"], "exit")
    wait_for(lambda: status(ns, job_name).get("phase") == "Failed", 60, "phase Failed", ctx)
    failed = condition(ns, job_name, "Failed")
    assert failed["reason"] == "ReachedMaxRestarts" and role in failed["message"], failed
    assert status(ns, job_name)["roles"][role]["restarts"] == len(HOWS) + 1
    wait_for(
        lambda: ns.get(RAYCLUSTERS, job_name) is None and not pods_of(ns, job_name, live=False),
        60,
        "the RayCluster and its pods gone",
        ctx,
    )

"""Per-role failure on the real stack: kwok reports a worker's death (or the pod or its node goes),
the operator restarts only that role's pods, KubeRay recreates them, the budget ends the job.

The four roles run at once, each in a job of its own (one namespace): a lost node's pods wait about a minute for
the pod GC (its quarantine of a missing node, a fixed 40 s, checked every 20 s), and the four waits overlap. The
cases that pick a node are kept apart: every role reaches `deleted` before any does (its pods must not land on
another role's spare node), one role at a time cordons all nodes but its spare, and every role has its spare
before any deletes its own (the pods made after the GC then find no spare left)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any

import pytest
from localkube.api import NAMESPACES, NODES, RAYCLUSTERS, RLTJ, Api
from localkube.nodes import NodeSpec, gpu_node
from localkube.stack import Cluster

from .conftest import delete_namespace
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


def seen_by_kuberay(ns: Api, job: str) -> bool:
    """KubeRay's status counts every worker of the job's RayCluster ready: its cache has them. A failure before
    that is a race with it (a pod deleted before its cache saw it stalls its group for minutes, docs/operator.md),
    which four jobs at once on two cores made it lose."""
    st = (ns.get(RAYCLUSTERS, job) or {}).get("status") or {}
    return bool(st.get("desiredWorkerReplicas")) and st.get("readyWorkerReplicas") == st["desiredWorkerReplicas"]


def spare_node(cluster: Cluster, role: str) -> str:
    name = f"spare-{role}-{secrets.token_hex(2)}"
    cluster.add_nodes([gpu_node(name) if role != "reward" else NodeSpec(name)])
    return name


class Steps:
    """What keeps the roles' runs apart where a case picks a node (the module's docstring)."""

    def __init__(self, runs: int):
        self.barrier, self.cordoning = threading.Barrier(runs), threading.Lock()

    def before(self, role: str, how: str) -> None:
        """Wait for every run to reach ``how`` where it is `deleted` or `node-deleted`."""
        if how in ("deleted", "node-deleted"):
            try:
                self.barrier.wait()
            except threading.BrokenBarrierError:
                raise AssertionError(f"another role's run failed before {role} was {how}") from None

    def alone(self, how: str) -> threading.Lock | nullcontext:
        return self.cordoning if how == "deleted" else nullcontext()


@pytest.fixture(scope="module")
def runs(cluster: Cluster, admin: Api, operator: OperatorProcess) -> Iterator[dict[str, Future]]:
    """Each role's run (`fail_in_every_way`), started at once in a namespace of the module's own."""
    namespace = f"t-role-failures-{secrets.token_hex(2)}"
    admin.create(NAMESPACES, {"metadata": {"name": namespace}}, namespace=None)
    ns, steps = admin.in_namespace(namespace), Steps(len(ROLES))

    def run(role: str) -> None:
        try:
            fail_in_every_way(cluster, ns, admin, operator, f"fails-{role}-{secrets.token_hex(2)}", role, steps)
        except BaseException:
            steps.barrier.abort()  # the other runs stop at their next barrier instead of waiting for this one
            raise

    with ThreadPoolExecutor(len(ROLES)) as pool:
        yield {role: pool.submit(run, role) for role in ROLES}
    delete_namespace(admin, namespace)


@pytest.mark.parametrize("role", ROLES)
def test_a_role_fails_in_every_way_and_only_it_restarts(runs: dict[str, Future], role: str) -> None:
    runs[role].result()


def fail_in_every_way(
    cluster: Cluster, ns: Api, admin: Api, operator: OperatorProcess, job_name: str, role: str, steps: Steps
) -> None:
    ns.create(RLTJ, manifest(job_name, roles={role: {"maxRestarts": len(HOWS)}}))
    ctx = lambda: describe(ns, job_name) + operator.tail(40)  # noqa: E731
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 90, "phase Running", ctx)
    replicas = status(ns, job_name)["roles"][role]["desired"]
    for count, how in enumerate(HOWS, 1):
        wait_for(lambda: seen_by_kuberay(ns, job_name), 60, "KubeRay to count every worker ready", ctx)
        steps.before(role, how)
        with steps.alone(how):
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
    wait_for(lambda: seen_by_kuberay(ns, job_name), 60, "KubeRay to count every worker ready", ctx)
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

"""Lifecycle on the real stack: suspend/resume, an operator restart mid-job, delete through the real
garbage collector, spec edits of a running job, children deleted by hand."""

from __future__ import annotations

import signal

import pytest
from localkube.api import CONFIGMAPS, JOBS, PODS, RAYCLUSTERS, RLTJ, SERVICES, Api

from .faults import fail_pod
from .jobs import condition, describe, events, manifest, pods_of, status, uids
from .operator_process import OperatorProcess
from .test_provision import CHILDREN
from .waits import holds, wait_for

pytestmark = pytest.mark.netns


def running_job(ns: Api, operator: OperatorProcess, name: str, **spec) -> None:
    ns.create(RLTJ, manifest(name, **spec))
    wait_for(
        lambda: status(ns, name).get("phase") == "Running",
        90,
        "phase Running",
        lambda: describe(ns, name) + operator.tail(30),
    )


def child_uids(ns: Api, name: str) -> dict[tuple[str, str], str]:
    return {(res, pattern): ns.get(res, pattern.format(name))["metadata"]["uid"] for res, pattern in CHILDREN}


def test_suspend_stops_the_runtime_and_resume_brings_it_back(ns: Api, operator: OperatorProcess, job_name: str) -> None:
    running_job(ns, operator, job_name)
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
    first = ns.get(RAYCLUSTERS, job_name)["metadata"]["uid"]
    secret = ns.get("v1/secrets", f"{job_name}-ray-auth")["data"]
    ns.patch(RLTJ, job_name, {"spec": {"suspend": True}})
    # The real garbage collector takes the RayCluster's pods and KubeRay's Service with it.
    wait_for(
        lambda: (
            ns.get(RAYCLUSTERS, job_name) is None
            and ns.get(JOBS, f"{job_name}-driver") is None
            and not pods_of(ns, job_name, live=False)
            and not ns.list(PODS, f"job-name={job_name}-driver")
        ),
        60,
        "RayCluster, driver Job and every pod gone",
        ctx,
    )
    wait_for(lambda: status(ns, job_name).get("phase") == "Suspended", 30, "phase Suspended", ctx)
    assert condition(ns, job_name, "Suspended")["status"] == "True" and status(ns, job_name)["restarts"] == 0
    assert ns.get(CONFIGMAPS, f"{job_name}-spec") and ns.get(CONFIGMAPS, f"{job_name}-progress")
    holds(
        lambda: status(ns, job_name)["phase"] == "Suspended" and status(ns, job_name)["restarts"] == 0,
        3,
        "Suspended, with no restarts counted for the pods that went",
    )
    ns.patch(RLTJ, job_name, {"spec": {"roles": {"critic": {"replicas": 1}}}})  # applied on resume

    ns.patch(RLTJ, job_name, {"spec": {"suspend": False}})
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 90, "Running after resume", ctx)
    cluster = ns.get(RAYCLUSTERS, job_name)
    assert cluster["metadata"]["uid"] != first
    assert [g["replicas"] for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == "critic"] == [1]
    assert len(pods_of(ns, job_name, "critic")) == 1 and status(ns, job_name)["restarts"] == 0
    assert ns.get("v1/secrets", f"{job_name}-ray-auth")["data"] == secret  # one Ray token for the job's life


def test_an_operator_restart_adopts_everything_and_duplicates_nothing(
    ns: Api, operator: OperatorProcess, job_name: str
) -> None:
    running_job(ns, operator, job_name)
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
    ref = pods_of(ns, job_name, "ref")[0]["metadata"]["name"]
    fail_pod(ns, ref, "oom")
    wait_for(lambda: status(ns, job_name)["roles"]["ref"]["restarts"] == 1, 60, "a counted ref restart", ctx)
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 90, "Running again", ctx)
    before, pods_before = child_uids(ns, job_name), uids(pods_of(ns, job_name))

    operator.stop(signal.SIGKILL)  # a crash: no cleanup, no goodbye
    try:
        critic = pods_of(ns, job_name, "critic")[0]["metadata"]["name"]
        fail_pod(ns, critic, "exit")  # the world moves on while the operator is away
        # KubeRay deletes a worker that has ended (restartPolicy Never) and makes a new one at once.
        wait_for(
            lambda: (p := ns.get(PODS, critic)) is None or p["status"].get("phase") == "Failed",
            30,
            "the critic pod ended (kwok)",
            ctx,
        )
    finally:
        operator.start()
    wait_for(
        lambda: status(ns, job_name)["roles"]["critic"]["restarts"] == 1,
        60,
        "the failure seen by the new operator",
        ctx,
    )
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 90, "Running under the new operator", ctx)
    assert child_uids(ns, job_name) == before
    for res, _ in CHILDREN:
        assert len(ns.list(res, f"kuberl.io/job={job_name}")) == [r for r, _ in CHILDREN].count(res), res
    holds(
        lambda: (
            status(ns, job_name)["roles"]["ref"]["restarts"] == 1
            and status(ns, job_name)["roles"]["critic"]["restarts"] == 1
        ),
        4,
        "each failure counted once",
    )
    survivors = uids([p for p in pods_of(ns, job_name) if p["metadata"]["labels"].get("kuberl.io/role") != "critic"])
    assert survivors <= pods_before and len(events(ns, job_name, "RoleRestart")) == 2


def test_delete_goes_through_the_garbage_collector_and_releases_the_finalizer(
    ns: Api, operator: OperatorProcess, job_name: str
) -> None:
    running_job(ns, operator, job_name)
    assert "kuberl.io/finalizer" in ns.get(RLTJ, job_name)["metadata"]["finalizers"]
    ns.delete(RLTJ, job_name)
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
    # Well within kopf's default 60 s re-check of a timer still running at deletion (handlers.configure).
    wait_for(lambda: ns.get(RLTJ, job_name) is None, 20, "the job gone (finalizer released)", ctx)
    wait_for(
        lambda: (
            not [(r, p) for r, p in CHILDREN if ns.get(r, p.format(job_name))]
            and not ns.list(PODS)
            and ns.get(SERVICES, f"{job_name}-head-svc") is None
        ),
        60,
        "every child, pod and KubeRay's Service gone",
        ctx,
    )


def test_orphaned_children_are_collected_when_the_operator_is_away(
    ns: Api, operator: OperatorProcess, job_name: str, admin: Api
) -> None:
    """Owner references alone: with no operator to delete them, the garbage collector removes every child."""
    running_job(ns, operator, job_name)
    operator.stop()
    try:
        ns.patch(RLTJ, job_name, {"metadata": {"finalizers": None}})  # as if the operator had released it
        ns.delete(RLTJ, job_name)
        wait_for(
            lambda: not [(r, p) for r, p in CHILDREN if ns.get(r, p.format(job_name))] and not ns.list(PODS),
            90,
            "the garbage collector to remove every child and pod",
            lambda: describe(ns, job_name),
        )
    finally:
        operator.start()


def test_a_spec_edit_of_a_running_job_waits_for_a_resume(ns: Api, operator: OperatorProcess, job_name: str) -> None:
    running_job(ns, operator, job_name)
    cluster = ns.get(RAYCLUSTERS, job_name)
    ns.patch(RLTJ, job_name, {"spec": {"trainer": {"steps": 7}}})
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
    event = wait_for(lambda: events(ns, job_name, "SpecChangePending"), 30, "a SpecChangePending Event", ctx)
    assert "spec.trainer" in event[0]["message"]
    wait_for(
        lambda: "steps: 7" in ns.get(CONFIGMAPS, f"{job_name}-spec")["data"]["job.yaml"],
        30,
        "the spec ConfigMap updated",
        ctx,
    )
    assert ns.get(RAYCLUSTERS, job_name)["metadata"]["generation"] == cluster["metadata"]["generation"]
    assert status(ns, job_name)["phase"] == "Running"
    wait_for(lambda: status(ns, job_name).get("observedGeneration") == 2, 30, "observedGeneration 2", ctx)


def test_children_deleted_by_hand_come_back(ns: Api, operator: OperatorProcess, job_name: str) -> None:
    running_job(ns, operator, job_name)
    ns.delete(JOBS, f"{job_name}-driver", body={"propagationPolicy": "Background"})
    ns.delete(CONFIGMAPS, f"{job_name}-spec")
    wait_for(
        lambda: (
            (j := ns.get(JOBS, f"{job_name}-driver"))
            and not j["metadata"].get("deletionTimestamp")
            and ns.get(CONFIGMAPS, f"{job_name}-spec")
        ),
        60,
        "the driver Job and spec ConfigMap recreated",
        lambda: describe(ns, job_name) + operator.tail(30),
    )
    assert (
        len(ns.list(JOBS, f"kuberl.io/job={job_name}")) == 1
        and len(ns.list(RAYCLUSTERS, f"kuberl.io/job={job_name}")) == 1
    )

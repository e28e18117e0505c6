"""A job that can never start, or whose role restart never completes, does not wait forever: past
spec.resilience.startTimeoutSeconds in Provisioning, or restartTimeoutSeconds in Restarting, it fails with
reason ProvisioningTimedOut or RestartTimedOut, an Event says which role waited for what, and its RayCluster goes.
The lifecycle fields of a batch Job hold too: spec.activeDeadlineSeconds, spec.ttlSecondsAfterFinished, and
spec.managedBy naming another controller."""

from __future__ import annotations

import time
from typing import Any

import pytest
from localkube.api import CONFIGMAPS, NODES, RAYCLUSTERS, RLTJ, Api, ApiError

from kuberl_operator.status import parse_time

from .faults import fail_pod
from .jobs import condition, describe, events, manifest, pods_of, status
from .operator_process import OperatorProcess
from .waits import wait_for

pytestmark = pytest.mark.netns


def test_a_job_whose_pods_never_schedule_fails_past_its_start_timeout(
    ns: Api, operator: OperatorProcess, job_name: str
) -> None:
    roles = {"critic": {"nodeSelector": {"kuberl.io/test-pool": "none"}}}  # no node carries it
    ns.create(RLTJ, manifest(job_name, roles=roles, resilience={"startTimeoutSeconds": 8}), strict=True)
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
    wait_for(lambda: status(ns, job_name).get("phase") == "Provisioning", 60, "Provisioning", ctx)
    failed = wait_for(lambda: condition(ns, job_name, "Failed"), 60, "the job failed", ctx)
    assert failed["reason"] == "ProvisioningTimedOut", failed
    assert "startTimeoutSeconds (8s)" in failed["message"] and "role critic 0/2" in failed["message"], failed
    assert "waits for a node" in failed["message"], failed  # the scheduler's reason
    (event,) = wait_for(lambda: events(ns, job_name, "ProvisioningTimedOut"), 30, "the Event", ctx)
    assert event["type"] == "Warning" and "critic" in event["message"]
    wait_for(lambda: not ns.list(RAYCLUSTERS, f"kuberl.io/job={job_name}"), 60, "the RayCluster deleted", ctx)


def test_a_role_restart_that_never_completes_fails_past_its_restart_timeout(
    ns: Api, admin: Api, operator: OperatorProcess, job_name: str
) -> None:
    label = {"kuberl.io/test-pool": job_name}  # one node takes the critic; without the label none does
    admin.patch(NODES, "gpu-3", {"metadata": {"labels": label}}, namespace=None)
    try:
        body = manifest(job_name, roles={"critic": {"nodeSelector": label}}, resilience={"restartTimeoutSeconds": 8})
        ns.create(RLTJ, body, strict=True)
        ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
        wait_for(lambda: status(ns, job_name).get("phase") == "Running", 90, "Running", ctx)
        admin.patch(NODES, "gpu-3", {"metadata": {"labels": {label_key: None for label_key in label}}},
                    namespace=None)
        fail_pod(ns, pods_of(ns, job_name, "critic")[0]["metadata"]["name"], "exit")
        wait_for(lambda: status(ns, job_name).get("phase") == "Restarting", 60, "Restarting", ctx)
        failed = wait_for(lambda: condition(ns, job_name, "Failed"), 60, "the job failed", ctx)
        assert failed["reason"] == "RestartTimedOut", failed
        assert "restartTimeoutSeconds (8s)" in failed["message"] and "role critic 0/2" in failed["message"], failed
        (event,) = wait_for(lambda: events(ns, job_name, "RestartTimedOut"), 30, "the Event", ctx)
        assert event["type"] == "Warning" and "critic" in event["message"]
        assert status(ns, job_name)["roles"]["critic"]["restarts"] == 1  # the restart counted, once
    finally:
        admin.patch(NODES, "gpu-3", {"metadata": {"labels": {label_key: None for label_key in label}}},
                    namespace=None)


def test_a_job_past_its_active_deadline_fails_and_is_deleted_once_its_ttl_passed(
    ns: Api, operator: OperatorProcess, job_name: str
) -> None:
    ns.create(RLTJ, manifest(job_name, activeDeadlineSeconds=5, ttlSecondsAfterFinished=4), strict=True)
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731

    def failed() -> dict[str, Any] | None:
        st = status(ns, job_name)
        return st if any(c["type"] == "Failed" and c["status"] == "True" for c in st.get("conditions", [])) else None

    st = wait_for(failed, 60, "the job failed", ctx, interval=0.2)
    reason = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert reason["reason"] == "DeadlineExceeded" and "spec.activeDeadlineSeconds (5s)" in reason["message"], st
    assert (parse_time(st["completionTime"]) - parse_time(st["startTime"])).total_seconds() >= 5
    wait_for(lambda: ns.get(RLTJ, job_name) is None, 60, "the job deleted after its TTL", ctx, interval=0.2)
    assert time.time() - parse_time(st["completionTime"]).timestamp() >= 4 - 1  # completionTime is to the second
    wait_for(lambda: not ns.list(RAYCLUSTERS, f"kuberl.io/job={job_name}"), 60, "the RayCluster deleted", ctx)


def test_a_job_another_controller_manages_is_left_alone(ns: Api, operator: OperatorProcess, job_name: str) -> None:
    """spec.managedBy names MultiKueue (whose manager cluster keeps a copy of the job): the operator makes
    nothing, writes no status and puts no finalizer on it; and the field cannot be changed afterwards."""
    ns.create(RLTJ, manifest(job_name, managedBy="kueue.x-k8s.io/multikueue"), strict=True)
    time.sleep(3 * operator.resync_seconds + 3)  # several passes' worth: the operator would have acted by now
    job = ns.get(RLTJ, job_name)
    assert not job.get("status") and not job["metadata"].get("finalizers"), job
    made = f"kuberl.io/job={job_name}"
    assert not ns.list(RAYCLUSTERS, made) and not ns.list(CONFIGMAPS, made)
    with pytest.raises(ApiError) as err:
        ns.patch(RLTJ, job_name, {"spec": {"managedBy": "kuberl.io/operator"}})
    assert err.value.status == 422 and "spec.managedBy is immutable" in err.value.message
    ns.delete(RLTJ, job_name)

"""A job that can never start, or whose role restart never completes, does not wait forever: past
spec.resilience.startTimeoutSeconds in Provisioning, or restartTimeoutSeconds in Restarting, it fails with
reason ProvisioningTimedOut or RestartTimedOut, an Event says which role waited for what, and its RayCluster goes."""

from __future__ import annotations

import pytest
from localkube.api import NODES, RAYCLUSTERS, RLTJ, Api

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

"""A spec change of a running job on the real stack: status.pendingChanges names the changed fields for as
long as the running RayCluster lacks them; a suspend and resume applies them and clears the list. (A
change of replicas applies live: tests/cluster/test_resize.py.)"""

from __future__ import annotations

import pytest
from localkube.api import RAYCLUSTERS, RLTJ, Api

from kuberl_operator.spec_changes import applied_spec

from .jobs import describe, pods_of, status
from .operator_process import OperatorProcess
from .test_lifecycle import running_job
from .waits import holds, wait_for

pytestmark = pytest.mark.netns


def test_pending_changes_are_reported_until_a_resume_applies_them(
    ns: Api, operator: OperatorProcess, job_name: str
) -> None:
    running_job(ns, operator, job_name)
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
    assert "pendingChanges" not in status(ns, job_name)
    ns.patch(RLTJ, job_name, {"spec": {"trainer": {"steps": 7}, "roles": {"ref": {"maxRestarts": 2}}}})
    wanted = ["spec.roles.ref.maxRestarts", "spec.trainer.steps"]
    wait_for(lambda: status(ns, job_name).get("pendingChanges") == wanted, 30, f"pendingChanges {wanted}", ctx)
    holds(lambda: status(ns, job_name).get("pendingChanges") == wanted and len(pods_of(ns, job_name, "ref")) == 1,
          3, "the change pending, the running ref untouched")
    ns.patch(RLTJ, job_name, {"spec": {"suspend": True}})
    wait_for(lambda: status(ns, job_name).get("phase") == "Suspended", 60, "phase Suspended", ctx)
    assert "pendingChanges" not in status(ns, job_name)  # nothing runs, nothing is pending
    ns.patch(RLTJ, job_name, {"spec": {"suspend": False}})
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 90, "Running after resume", ctx)
    assert "pendingChanges" not in status(ns, job_name)
    built = applied_spec(ns.get(RAYCLUSTERS, job_name))
    assert built["roles"]["ref"]["maxRestarts"] == 2 and built["trainer"]["steps"] == 7

"""What user code in a driver can report, with its own credentials, on the real stack.

The driver's ServiceAccount may get and patch its job's progress ConfigMap, and user code (the reward function,
a program) runs in the driver. Before, the operator took a report from any ConfigMap labelled with a job's name,
so a driver that relabelled its own ConfigMap could fail another job; and a report with NaN tokens/s made every
status patch fail, freezing the job's status. Now the report comes only from the ConfigMap named for the job, and
a malformed or unbounded field is dropped (a ProgressRefused Event), the rest used; and the chart's driver-progress
policy holds the driver's writes to data.progress (RBAC has no field rules).
"""

from __future__ import annotations

import json

import pytest
from localkube.api import CONFIGMAPS, RLTJ, Api, ApiError
from localkube.stack import Cluster

from .jobs import describe, events, manifest, status
from .operator_process import OperatorProcess
from .waits import holds, wait_for

pytestmark = pytest.mark.netns


def as_driver(cluster: Cluster, admin: Api, ns: Api, job: str) -> Api:
    """A client with the job's driver ServiceAccount token, as user code in the driver pod has."""
    return Api(cluster.server, cluster.pki / "ca.crt", ns.namespace, token=admin.token(ns.namespace, f"{job}-driver"))


def test_a_drivers_report_cannot_fail_another_job_nor_freeze_its_own(cluster: Cluster, ns: Api, admin: Api,
                                                                     operator: OperatorProcess, job_name: str) -> None:
    victim, attacker = f"{job_name}-v", f"{job_name}-a"
    for name in (victim, attacker):
        ns.create(RLTJ, manifest(name))
    ctx = lambda: describe(ns, victim) + describe(ns, attacker) + operator.tail(30)  # noqa: E731
    wait_for(lambda: all(status(ns, n).get("phase") == "Running" for n in (victim, attacker)), 90, "both Running", ctx)
    driver = wait_for(lambda: ns.get(CONFIGMAPS, f"{attacker}-progress") and as_driver(cluster, admin, ns, attacker),
                      30, "the attacker's driver ServiceAccount", ctx)

    # NaN, past int64, a huge message: dropped, the rest of the report mirrored, and an Event says what was.
    report = '{"step": 5, "totalSteps": 60, "tokensPerSec": NaN, "message": "%s"}' % ("x" * 5000)
    driver.patch(CONFIGMAPS, f"{attacker}-progress", {"data": {"progress": report}})
    wait_for(lambda: status(ns, attacker).get("step") == 5, 30, "step 5 mirrored despite the NaN", ctx)
    (refused,) = wait_for(lambda: events(ns, attacker, "ProgressRefused"), 30, "a ProgressRefused Event", ctx)
    assert "tokensPerSec" in refused["message"] and "message" in refused["message"]

    # The chart's driver-progress policy lets the driver change data.progress alone: no relabelling, and not
    # data.replicas, the operator's word to it.
    failed = json.dumps({"step": 1, "phase": "Failed", "reason": "RoleError", "message": "injected"})
    relabel = {"metadata": {"labels": {"kuberl.io/job": victim}}, "data": {"progress": failed}}
    for patch in (relabel, {"data": {"replicas": '{"roles": {"reward": 9}}'}}):
        with pytest.raises(ApiError) as err:
            driver.patch(CONFIGMAPS, f"{attacker}-progress", patch)
        assert err.value.status in (403, 422) and "may change only data.progress" in err.value.message, err.value
    # Relabelled to the victim's name all the same (as on a cluster without the policy: by the admin here), its
    # own ConfigMap reports for no one but itself.
    ns.patch(CONFIGMAPS, f"{attacker}-progress", relabel)
    wait_for(lambda: ns.get(CONFIGMAPS, f"{attacker}-progress")["metadata"]["labels"]["kuberl.io/job"] == victim,
             20, "the relabelled report", ctx)
    untouched = lambda: status(ns, victim).get("phase") == "Running" and "injected" not in json.dumps(  # noqa: E731
        status(ns, victim))
    holds(untouched, 4 * operator.resync_seconds + 4, "the victim Running, untouched by the report", logs=ctx)

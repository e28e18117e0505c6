"""Two operator replicas on the real stack, electing a leader on the chart's Lease with the chart's RBAC: the
standby serves its probes and takes over a role restart when the leader is killed, within the Lease's bound, and
nothing is duplicated or counted twice; a leader stopped cleanly hands the Lease over at once."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from localkube.api import Api

from .conftest import OPERATOR_NAMESPACE, RELEASE
from .faults import fail_pod
from .jobs import describe, events, pods_of, status, uids
from .operator_process import OperatorProcess, http_get
from .test_lifecycle import child_uids, running_job
from .waits import holds, wait_for

pytestmark = pytest.mark.netns
LEASES = "coordination.k8s.io/v1/leases"
LEASE_SECONDS = 6
RETRY_S = LEASE_SECONDS / 7.5  # leader.Terms.retry_every_s
START_S = 15  # kopf's start after the takeover: its first lists and watches, on a busy 2-core machine
ELECTION = ("--leader-elect", f"--lease-name={RELEASE}", f"--leader-elect-namespace={OPERATOR_NAMESPACE}",
            f"--lease-seconds={LEASE_SECONDS}")


def leading(proc: OperatorProcess) -> bool:
    """The replica's own word: kuberl_operator_leader on its /metrics (a standby serves them too)."""
    proc.alive()
    code, text = http_get(proc.metrics_url)
    return code == 200 and "\nkuberl_operator_leader 1.0" in text


def test_the_standby_takes_over_a_role_restart_when_the_leader_dies(
    ns: Api, admin: Api, operator: OperatorProcess, job_name: str, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    operator.stop()  # the session's operator is not elected: these two replace it for this test
    first, second = (OperatorProcess(operator_kubeconfig, tmp_path, extra=ELECTION) for _ in range(2))
    second.starts = 10  # its own log files
    try:
        first.start()
        wait_for(lambda: leading(first), 30, "the first replica to lead", first.tail)
        second.start()  # serves liveness and metrics while it waits
        holds(lambda: leading(first) and not leading(second), 2 * RETRY_S + 1, "one leader, one standby")
        lease = admin.get(LEASES, RELEASE, namespace=OPERATOR_NAMESPACE)
        assert lease["spec"]["leaseDurationSeconds"] == LEASE_SECONDS
        assert lease["metadata"]["annotations"]["kuberl.io/operator-version"]

        running_job(ns, first, job_name)
        ctx = lambda: describe(ns, job_name) + first.tail(20) + second.tail(30)  # noqa: E731
        before, pods_before = child_uids(ns, job_name), uids(pods_of(ns, job_name))
        ref = pods_of(ns, job_name, "ref")[0]["metadata"]["name"]
        fail_pod(ns, ref, "oom")
        wait_for(lambda: status(ns, job_name)["roles"]["ref"]["restarts"] == 1, 60, "a counted ref restart", ctx)
        first.stop(signal.SIGKILL)  # mid-restart: no release, the Lease must run out
        killed = time.monotonic()
        wait_for(lambda: leading(second), LEASE_SECONDS + RETRY_S + 5, "the standby to take the Lease", ctx)
        took_over = time.monotonic() - killed
        assert took_over <= LEASE_SECONDS + RETRY_S + 2, took_over
        print(f"takeover after the leader's SIGKILL: {took_over:.1f} s (Lease {LEASE_SECONDS} s)")

        wait_for(lambda: status(ns, job_name).get("phase") == "Running", 90 + START_S, "Running under the new leader",
                 ctx)
        assert child_uids(ns, job_name) == before
        holds(lambda: status(ns, job_name)["roles"]["ref"]["restarts"] == 1 and status(ns, job_name)["restarts"] == 1,
              4, "the restart counted once")
        survivors = uids([p for p in pods_of(ns, job_name) if p["metadata"]["labels"].get("kuberl.io/role") != "ref"])
        assert survivors <= pods_before and len(events(ns, job_name, "RoleRestart")) == 1
        holder = admin.get(LEASES, RELEASE, namespace=OPERATOR_NAMESPACE)["spec"]
        assert holder["holderIdentity"] != lease["spec"]["holderIdentity"] and holder["leaseTransitions"] >= 1

        first.start()  # back, as the standby
        second.stop(signal.SIGTERM)  # a rollout: the leader releases the Lease on its way out
        exited = time.monotonic()  # unreleased, the Lease would last LEASE_SECONDS from its last renewal (<= 2 s ago)
        wait_for(lambda: leading(first), LEASE_SECONDS, "the released Lease taken", first.tail)
        handed = time.monotonic() - exited
        assert handed < 2 * RETRY_S + 1.5, f"a clean stop hands the Lease over at once, not after {handed:.1f} s"
        print(f"takeover after the leader's SIGTERM: {handed:.1f} s")
    finally:
        first.stop()
        second.stop()
        operator.start()

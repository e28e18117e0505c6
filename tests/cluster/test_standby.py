"""Standby pods on the real stack (spec.resilience.standby): each role's worker group runs one extra Running
pod; when a pod of the role fails, only it goes, the standby is already there (no scheduling, no image pull),
and KubeRay makes a replacement pod, the next standby."""

from __future__ import annotations

import pytest
from localkube.api import RAYCLUSTERS, RLTJ, Api

from .faults import fail_pod
from .jobs import ROLES, describe, events, manifest, pods_of, running, status, uids
from .operator_process import OperatorProcess
from .waits import wait_for

pytestmark = pytest.mark.netns
REPLICAS = {"actor": 2, "critic": 2, "ref": 1, "reward": 1}  # jobs.manifest's


def test_a_failed_pod_is_replaced_by_the_running_standby_and_a_new_standby_is_made(
    ns: Api, operator: OperatorProcess, job_name: str
) -> None:
    ns.create(RLTJ, manifest(job_name, resilience={"standby": True}))
    ctx = lambda: describe(ns, job_name) + operator.tail(40)  # noqa: E731
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 90, "phase Running", ctx)
    groups = {g["groupName"]: g for g in ns.get(RAYCLUSTERS, job_name)["spec"]["workerGroupSpecs"]}
    assert {r: g["replicas"] for r, g in groups.items()} == {r: n + 1 for r, n in REPLICAS.items()}
    st = status(ns, job_name)
    assert {r: (s["desired"], s["ready"], s["standby"]) for r, s in st["roles"].items()} == {
        r: (n + 1, n + 1, 1) for r, n in REPLICAS.items()
    }
    mine = pods_of(ns, job_name, "critic")
    assert len(mine) == 3 and running(mine)
    victim, survivors = mine[0], mine[1:]
    fail_pod(ns, victim["metadata"]["name"], "exit")

    st = wait_for(lambda: (s := status(ns, job_name))["roles"]["critic"]["restarts"] == 1 and s, 60, "a restart", ctx)
    assert victim["metadata"]["name"] in st["roles"]["critic"]["lastFailure"]
    # The survivors, the standby among them, were never touched: the same pods, Running all along.
    alive = {p["metadata"]["uid"]: p for p in pods_of(ns, job_name, "critic")}
    assert uids(survivors) <= alive.keys() and running([alive[u] for u in uids(survivors)])
    assert all(alive[p["metadata"]["uid"]]["spec"]["nodeName"] == p["spec"]["nodeName"] for p in survivors)
    # KubeRay makes one new pod: the next standby.
    new = wait_for(
        lambda: len(p := pods_of(ns, job_name, "critic")) == 3 and running(p) and len(uids(p) - uids(mine)) == 1 and p,
        120,
        "one new critic pod, the next standby",
        ctx,
    )
    assert uids(survivors) <= uids(new)
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 60, "Running again", ctx)
    restarts = {r: s["restarts"] for r, s in status(ns, job_name)["roles"].items()}
    assert restarts == {r: int(r == "critic") for r in ROLES}
    (restart,) = events(ns, job_name, "RoleRestart")
    assert "its standby takes the failed pods' place" in restart["message"]

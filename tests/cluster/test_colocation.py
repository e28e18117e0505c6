"""Colocated roles on the real stack (spec.roles.<role>.colocateWith): the guest has no worker group of its own,
its ranks run in its host's pods, which advertise both roles' Ray resources and ask for the GPUs once. A failure
of the guest's processes restarts only them (the driver's work): no pod is deleted or made; a host pod's loss is a
failure of both roles."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from localkube.api import RAYCLUSTERS, RLTJ, Api
from localkube.stack import Cluster

from .faults import fail_pod
from .jobs import ROLES, describe, events, manifest, others_of, pods_of, running, status, uids
from .local_driver import driver_env, start_driver
from .operator_process import OperatorProcess
from .waits import holds, wait_for

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.netns


def groups(ns: Api, job: str) -> dict[str, dict]:
    return {g["groupName"]: g for g in ns.get(RAYCLUSTERS, job)["spec"]["workerGroupSpecs"]}


def ray_resources(group: dict) -> dict[str, int]:
    return json.loads(group["rayStartParams"]["resources"].strip("'"))


def test_a_host_pod_failure_restarts_both_colocated_roles_and_only_their_pods(
    ns: Api, operator: OperatorProcess, job_name: str
) -> None:
    """Actor 2 x 1 GPU with the ref colocated: one worker group whose two pods carry both roles, one GPU each;
    one of them exits: actor and ref each count one restart, the shared pods are replaced, no other pod is."""
    ns.create(RLTJ, manifest(job_name, roles={"ref": {"replicas": 2, "colocateWith": "actor"}}))
    ctx = lambda: describe(ns, job_name) + operator.tail(40)  # noqa: E731
    st = wait_for(lambda: (s := status(ns, job_name)).get("phase") == "Running" and s, 90, "phase Running", ctx)
    assert list(groups(ns, job_name)) == ["actor", "critic", "reward"]
    actor = groups(ns, job_name)["actor"]
    assert ray_resources(actor) == {"kuberl_role_actor": 1, "kuberl_role_ref": 1, "kuberl_node_$(KUBERL_NODE_NAME)": 1}
    shared = pods_of(ns, job_name, "actor")
    assert len(shared) == 2 and running(shared) and not pods_of(ns, job_name, "ref")
    assert all(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1" for p in shared)
    assert {r: (s["desired"], s["ready"]) for r, s in st["roles"].items()} == {
        "actor": (2, 2), "critic": (2, 2), "ref": (2, 2), "reward": (1, 1)}
    assert st["roles"]["ref"]["colocatedWith"] == "actor"

    others = others_of(ns, job_name, "actor")
    fail_pod(ns, shared[0]["metadata"]["name"], "exit")
    st = wait_for(
        lambda: (s := status(ns, job_name))["roles"]["ref"]["restarts"] == 1 and s, 60, "the ref's restart", ctx
    )
    assert {r: s["restarts"] for r, s in st["roles"].items()} == {"actor": 1, "critic": 0, "ref": 1, "reward": 0}
    assert all(shared[0]["metadata"]["name"] in st["roles"][r]["lastFailure"] for r in ("actor", "ref"))
    wait_for(
        lambda: len(p := pods_of(ns, job_name, "actor")) == 2 and running(p) and not uids(p) & uids(shared),
        120,
        "KubeRay's new shared pods",
        ctx,
    )
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 60, "Running again", ctx)
    assert others_of(ns, job_name, "actor") == others
    restarts = wait_for(lambda: len(e := events(ns, job_name, "RoleRestart")) == 2 and e, 30, "2 RoleRestarts", ctx)
    assert sorted(e["message"].split(":")[0] for e in restarts) == ["role actor", "role ref"]
    assert status(ns, job_name)["restarts"] == 2


def test_a_failure_of_the_colocated_roles_process_restarts_only_it(
    cluster: Cluster, ns: Api, admin: Api, operator: OperatorProcess, job_name: str, tmp_path: Path
) -> None:
    """The CPU quickstart with ref colocated with the actor, on the cluster (kwok runs the pods) and, as its driver,
    a real `kuberl run` of the same manifest on this machine (Ray, torch), which kills the ref's process at step 2
    and restarts it alone, and reports so. The operator mirrors the ref's restart and touches no pod: the actor's
    pods, the ref's home, keep their UIDs; the actor counts none."""
    job = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    job["metadata"]["name"] = job_name
    job["spec"]["trainer"].update(steps=3, checkpoint={"interval": 2})
    job["spec"]["roles"]["ref"]["colocateWith"] = "actor"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    ns.create(RLTJ, job)
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 90, "phase Running", ctx)
    assert list(groups(ns, job_name)) == ["actor", "critic", "reward"]
    limits = groups(ns, job_name)["actor"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert (limits["cpu"], limits["memory"]) == ("750m", "3Gi")  # the actor's 500m, 2Gi and the ref's 250m, 1Gi
    before = {r: uids(pods_of(ns, job_name, r)) for r in ("actor", "critic", "reward")}

    env = driver_env(cluster, admin, ns.namespace, job_name, tmp_path / "serviceaccount", ctx)
    driver = start_driver(env, path, tmp_path / "out", tmp_path / "driver.log", "--fault", "ref:2")
    log = lambda: ctx() + "\n--- driver log:\n" + (tmp_path / "driver.log").read_text()[-3000:]  # noqa: E731
    try:
        deadline = time.monotonic() + 420
        while driver.poll() is None and time.monotonic() < deadline:
            assert {r: uids(pods_of(ns, job_name, r)) for r in before} == before, "a pod was replaced" + log()
            time.sleep(1)
        assert driver.wait(5) == 0, log()
    finally:
        if driver.poll() is None:
            driver.kill()
    st = wait_for(lambda: (s := status(ns, job_name)).get("step") == 3 and s, 30, "the last step mirrored", log)
    assert {r: s["restarts"] for r, s in st["roles"].items()} == {r: int(r == "ref") for r in ROLES}
    assert st["roles"]["ref"]["podRestarts"] == 0 and "at step 2" in st["roles"]["ref"]["lastFailure"]
    assert not events(ns, job_name, "RoleRestart")  # nothing for the operator to restart
    holds(lambda: {r: uids(pods_of(ns, job_name, r)) for r in before} == before, 3, "the pods' UIDs", logs=log)
    # The driver's own account: one recovery, of the ref, and the actor never restarted.
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["role"] for rec in records for r in rec.get("recoveries", [])] == ["ref"], records
    assert (records[-1]["restarts_ref"], records[-1]["restarts_actor"]) == (1, 0)

"""A live resize of the reward role on the real stack: `kubectl patch` of spec.roles.reward.replicas grows
the RayCluster's reward group at once and asks the driver for the new size (data.replicas of
`<job>-progress`); a shrink waits until the driver reports that it runs the smaller group, then gives up
the pods no reward rank uses. No other role's pod is touched, and no pod given up counts as a failure.

kwok runs no containers, so the driver's half is played here with the driver's own ServiceAccount token
(its Role: get and patch of `<job>-progress`); the real driver reading the same document is tested on a
local Ray (tests/integration/test_resize.py)."""

from __future__ import annotations

import json

import pytest
from localkube.api import CONFIGMAPS, RAYCLUSTERS, RLTJ, Api
from localkube.stack import Cluster

from kuberl.metrics.progress import ProgressReporter
from kuberl.spec.contract import ProgressDocument, RoleProgress

from .jobs import describe, events, pods_of, status, uids
from .operator_process import OperatorProcess
from .test_lifecycle import running_job
from .waits import holds, wait_for

pytestmark = pytest.mark.netns


def reward_group(ns: Api, job: str) -> dict:
    return next(g for g in ns.get(RAYCLUSTERS, job)["spec"]["workerGroupSpecs"] if g["groupName"] == "reward")


def live_names(ns: Api, job: str, role: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods_of(ns, job, role) if not p["metadata"].get("deletionTimestamp"))


def report(driver: ProgressReporter, reward_hosts: list[str]) -> None:
    """What the driver patches after a step: its progress, with the reward group it runs now."""
    doc = ProgressDocument(step=2, total_steps=10, phase="Running",
                           roles={"reward": RoleProgress(replicas=len(reward_hosts), hosts=reward_hosts)})
    assert driver.report(doc)


def asked(driver: ProgressReporter) -> dict[str, int]:
    """What the driver reads between two steps."""
    doc = driver.desired_replicas()
    assert doc is not None
    return doc.roles


def test_patching_reward_replicas_resizes_only_its_group(
    cluster: Cluster, ns: Api, admin: Api, operator: OperatorProcess, job_name: str
) -> None:
    running_job(ns, operator, job_name)
    ctx = lambda: describe(ns, job_name) + json.dumps(status(ns, job_name).get("roles", {}).get("reward")) + json.dumps(  # noqa: E731
        status(ns, job_name).get("pendingChanges")) + operator.tail(40)
    token = admin.token(ns.namespace, f"{job_name}-driver", 3600)
    driver = ProgressReporter(cluster.server, ns.namespace, f"{job_name}-progress", token=token,
                              ca_file=str(cluster.pki / "ca.crt"))  # the driver's own transport and identity
    others = {r: uids(pods_of(ns, job_name, r)) for r in ("actor", "critic", "ref")}
    first = live_names(ns, job_name, "reward")
    assert len(first) == 1 and asked(driver) == {"actor": 2, "critic": 2, "ref": 1, "reward": 1}
    report(driver, first)

    # grow 1 -> 2: the group and the driver's document follow at once; pending until the driver reports 2
    ns.patch(RLTJ, job_name, {"spec": {"roles": {"reward": {"replicas": 2}}}})
    wait_for(lambda: reward_group(ns, job_name)["replicas"] == 2, 30, "the reward group at 2", ctx)
    wait_for(lambda: asked(driver) == {"actor": 2, "critic": 2, "ref": 1, "reward": 2}, 30, "2 reward asked for", ctx)
    wait_for(lambda: len(live_names(ns, job_name, "reward")) == 2 and status(ns, job_name)["roles"]["reward"][
        "ready"] == 2, 60, "two reward pods ready", ctx)
    st = status(ns, job_name)
    assert st["roles"]["reward"]["desired"] == 2 and st["pendingChanges"] == ["spec.roles.reward.replicas"]
    two = live_names(ns, job_name, "reward")
    report(driver, two)
    wait_for(lambda: "pendingChanges" not in status(ns, job_name) and status(ns, job_name)["roles"]["reward"].get(
        "replicas") == 2, 30, "the grow applied", ctx)

    # shrink 2 -> 1: the group keeps both pods while the driver still runs two ranks ...
    ns.patch(RLTJ, job_name, {"spec": {"roles": {"reward": {"replicas": 1}}}})
    wait_for(lambda: asked(driver)["reward"] == 1, 30, "the driver asked for 1 reward", ctx)
    holds(lambda: reward_group(ns, job_name)["replicas"] == 2 and live_names(ns, job_name, "reward") == two, 3,
          "both reward pods kept until the driver runs one rank")
    assert status(ns, job_name)["pendingChanges"] == ["spec.roles.reward.replicas"]
    # ... and gives up the pod no rank uses once the driver reports its one rank, on the second pod
    kept = two[1]
    kept_uid = next(p["metadata"]["uid"] for p in pods_of(ns, job_name, "reward") if p["metadata"]["name"] == kept)
    report(driver, [kept])
    wait_for(lambda: reward_group(ns, job_name)["replicas"] == 1 and live_names(ns, job_name, "reward") == [kept],
             60, f"only {kept} left", ctx)
    wait_for(lambda: len(pods_of(ns, job_name, "reward", live=False)) == 1, 60, "the given-up pod gone", ctx)
    assert reward_group(ns, job_name)["scaleStrategy"] == {"workersToDelete": [two[0]]}
    holds(lambda: (s := status(ns, job_name))["phase"] == "Running" and s["roles"]["reward"]["restarts"] == 0
          and s["roles"]["reward"]["ready"] == 1 and "pendingChanges" not in s, 3, "Running, no restart counted")
    assert uids(pods_of(ns, job_name, "reward")) == {kept_uid}
    assert {r: uids(pods_of(ns, job_name, r)) for r in others} == others  # no other role's pod moved
    assert status(ns, job_name)["roles"]["reward"]["desired"] == 1
    resized = [e["message"] for e in events(ns, job_name, "RoleResized")]
    assert any("reward 2" in m for m in resized) and any(f"giving up pods {two[0]}" in m for m in resized), resized
    assert not events(ns, job_name, "RoleRestart") and not events(ns, job_name, "SpecChangePending")
    assert json.loads(ns.get(CONFIGMAPS, f"{job_name}-progress")["data"]["progress"])["roles"]["reward"][
        "replicas"] == 1

"""Live resizes of a role (here the reward), without a server: what the operator asks the driver, how it sizes the
RayCluster's worker groups (a shrink waits for the driver, and gives up only pods no rank uses), and
that a pod given up is no failure of the role."""

from __future__ import annotations

import copy
import json

import pytest

from kuberl.spec import validate_manifest
from kuberl.spec.contract import REPLICAS_KEY, ProgressDocument, ReplicasDocument, RoleProgress
from kuberl_operator import builders, resize
from kuberl_operator.cache import kept
from kuberl_operator.health import PodView
from kuberl_operator.reconcile import diff_field_paths, worker_groups
from kuberl_operator.spec_changes import applied_spec
from kuberl_operator.status import Observed, decide

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"


def job(reward: int = 1, ref: int = 1, **spec):
    return validate_manifest({
        "apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
        "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "m.n:f"},
                 "roles": {"reward": {"replicas": reward}, "ref": {"replicas": ref}}, **spec},
    })


def pods(rewards: list[str], deleting: frozenset[str] = frozenset()) -> tuple[PodView, ...]:
    names = {"actor": ["a0"], "critic": ["c0"], "ref": ["r0"], "reward": rewards}
    return tuple(PodView(name=n, uid=f"u-{n}", role=role, owner="rc", ready=True, failure=None, deleting=False)
                 if n not in deleting else
                 PodView(name=n, uid=f"u-{n}", role=role, owner="rc", ready=False, failure="deleted", deleting=True)
                 for role, ns in names.items() for n in ns)


def reports(reward: int, hosts: list[str]) -> ProgressDocument:
    return ProgressDocument(step=3, roles={"reward": RoleProgress(replicas=reward, hosts=hosts)})


def test_the_driver_is_asked_for_the_spec_replicas_of_every_built_in_role() -> None:
    cm = builders.progress_configmap(job(reward=4, ref=2), builders.BuildOptions(namespace="ns"))
    assert ReplicasDocument.parse(cm["data"][REPLICAS_KEY]).roles == {"actor": 1, "critic": 1, "ref": 2, "reward": 4}
    assert json.loads(cm["data"]["progress"]) == {}
    assert "ref" not in builders.replicas_document(job(ref=0)).roles  # a disabled role is not asked for
    assert resize.live_fields(job()) == {f"spec.roles.{r}.replicas" for r in ("actor", "critic", "ref", "reward")}


def test_a_colocation_set_is_not_resized_live_its_replicas_wait_for_a_restart() -> None:
    """The set's roles must keep one size (the spec model), which one role's live resize cannot keep: the
    operator neither asks the driver nor resizes the shared group, and reports the change as pending."""
    shared = job(roles={"actor": {"gpus": 1}, "ref": {"gpus": 1, "colocateWith": "actor"}, "reward": {"replicas": 1}})
    assert resize.live_roles(shared) == ("critic", "reward")
    assert resize.live_fields(shared) == {"spec.roles.critic.replicas", "spec.roles.reward.replicas"}
    assert set(builders.replicas_document(shared).roles) == {"critic", "reward"}
    # The reader drops what is not a whole count (a bool, a string), and a malformed document.
    assert ReplicasDocument.parse('{"roles": {"reward": 2, "ref": "3", "x": true}}').roles == {"reward": 2}
    assert ReplicasDocument.parse("not json").roles == {}


def test_a_grow_sizes_the_group_at_once_and_a_shrink_waits_for_the_driver() -> None:
    built = applied_spec(builders.ray_cluster(job(reward=1), builders.BuildOptions(namespace="ns")))
    assert resize.group_pods(job(reward=4), "reward", ProgressDocument(), built) == 4  # grow: at once
    assert resize.pending(job(reward=4), "reward", ProgressDocument(), built)  # the driver still runs 1
    assert not resize.pending(job(reward=4), "reward", reports(4, ["w0", "w1", "w2", "w3"]), built)
    # shrink 4 -> 1: the group keeps 4 pods while the driver reports 4, and gives them up once it reports 1
    assert resize.group_pods(job(reward=1), "reward", reports(4, ["w0", "w1", "w2", "w3"]), built, 4) == 4
    assert resize.group_pods(job(reward=1), "reward", reports(1, ["w1"]), built, 4) == 1
    # with a standby, its pod comes on top; none for a role that leaves the job's standby out
    assert resize.group_pods(job(reward=2, resilience={"standby": True}), "reward", reports(1, ["w0"]), built) == 3
    alone = job(reward=2, resilience={"standby": True})
    alone.spec.roles.reward.standby = False
    assert resize.group_pods(alone, "reward", reports(1, ["w0"]), built) == 2
    assert builders.group_size(alone, "reward") == 2 and builders.group_size(alone, "critic") == 2


def test_a_drivers_report_never_grows_a_group_past_the_spec() -> None:
    """User code runs in the driver: a report of more replicas than any spec asked (the spec's now, or the group's
    size, which an earlier spec made) does not grow the RayCluster."""
    built = applied_spec(builders.ray_cluster(job(reward=2), builders.BuildOptions(namespace="ns")))
    many = reports(500, [f"w{i}" for i in range(500)])
    assert resize.group_pods(job(reward=2), "reward", many, built, 2) == 2
    assert resize.group_pods(job(reward=1), "reward", many, built, 3) == 3  # a pending shrink 3 -> 1 keeps 3


def test_a_shrink_gives_up_the_pods_no_rank_runs_on() -> None:
    reward = [p for p in pods(["w0", "w1", "w2"]) if p.role == "reward"]
    assert [p.name for p in resize.leaving(reward, 1, ["w1"])] == ["w0", "w2"]
    assert [p.name for p in resize.leaving(reward, 2, ["w1", "w2"])] == ["w0"]
    assert resize.leaving(reward, 3, []) == ()


def applied(obj: dict, ops: list[dict]) -> dict:
    """``ops`` (the JSON patch operations cluster_patch makes: test, add) applied to a copy of ``obj``."""
    out = copy.deepcopy(obj)
    for op in ops:
        *parents, last = op["path"].strip("/").split("/")
        at = out
        for part in parents:
            at = at[int(part)] if isinstance(at, list) else at[part]
        if op["op"] == "test":
            assert at[last] == op["value"], op
        else:
            at[last] = op["value"]
    return out


def test_the_raycluster_patch_sizes_only_the_resized_group(validator) -> None:
    cluster = builders.ray_cluster(job(reward=4), builders.BuildOptions(namespace="ns"))
    assert worker_groups(cluster) == {"actor": 1, "critic": 1, "ref": 1, "reward": 4}
    assert resize.cluster_patch(cluster, {"ref": 1, "reward": 4}, {}) is None  # nothing to change
    ops = resize.cluster_patch(kept("rayclusters", cluster), {"ref": 1, "reward": 1}, {"reward": ("w2", "w0")})
    assert ops[0] == {"op": "test", "path": "/spec/workerGroupSpecs/3/groupName", "value": "reward"}
    assert {op["path"].rsplit("/", 2)[1] for op in ops} == {"3"}  # the reward group alone
    resized = applied(cluster, ops)
    groups = {g["groupName"]: g for g in resized["spec"]["workerGroupSpecs"]}
    assert {k: groups["reward"][k] for k in ("replicas", "minReplicas", "maxReplicas")} == dict.fromkeys(
        ("replicas", "minReplicas", "maxReplicas"), 1)
    assert groups["reward"]["scaleStrategy"] == {"workersToDelete": ["w0", "w2"]}
    assert groups["reward"]["template"] == cluster["spec"]["workerGroupSpecs"][3]["template"]
    unchanged = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    assert all(groups[r] == unchanged[r] for r in ("actor", "critic", "ref"))
    validator(resized)  # KubeRay's schema takes it
    grow = applied(cluster, resize.cluster_patch(cluster, {"reward": 8}, {}))
    assert {g["groupName"]: g for g in grow["spec"]["workerGroupSpecs"]}["reward"]["scaleStrategy"] == {
        "workersToDelete": []}
    moved = applied(cluster, [])
    moved["spec"]["workerGroupSpecs"].reverse()  # the list changed since the cache's copy: the test op refuses
    with pytest.raises(AssertionError):
        applied(moved, ops)


def test_a_live_replicas_change_is_not_an_event_for_a_resume() -> None:
    diff = [("change", ("roles", "reward", "replicas"), 1, 2), ("change", ("trainer", "steps"), 5, 7)]
    assert diff_field_paths(diff, resize.live_fields(job())) == ["spec.trainer.steps"]


def test_status_follows_a_shrink_and_counts_no_failure() -> None:
    built = applied_spec(builders.ray_cluster(job(reward=2), builders.BuildOptions(namespace="ns")))
    two = pods(["w0", "w1"])
    seen = Observed("rc", two, reports(2, ["w0", "w1"]), applied_spec=built,
                    groups={"actor": 1, "critic": 1, "ref": 1, "reward": 2})
    st = decide(job(reward=2), 1, {}, seen, T0).status
    st = decide(job(reward=2), 1, st, seen, T0).status
    assert st["phase"] == "Running" and st["roles"]["reward"]["replicas"] == 2 and "pendingChanges" not in st
    # spec.roles.reward.replicas 2 -> 1; the driver has not applied it yet: the group keeps its pods
    waiting = decide(job(reward=1), 2, st, seen, T1)
    assert waiting.groups["reward"] == 2 and waiting.leaving == {} and waiting.delete_pods == ()
    assert waiting.status["pendingChanges"] == ["spec.roles.reward.replicas"]
    assert waiting.status["roles"]["reward"]["desired"] == 1
    # the driver runs one rank, on w1: w0 is given up, as no failure
    applied = Observed("rc", two, reports(1, ["w1"]), applied_spec=built, groups=seen.groups)
    shrink = decide(job(reward=1), 2, waiting.status, applied, T1)
    assert shrink.groups["reward"] == 1 and shrink.leaving == {"reward": ("w0",)}
    assert shrink.delete_pods == ()  # KubeRay deletes w0 (workersToDelete): gone first, it would delete w1 too
    assert not [e for e in shrink.events if e.reason == "RoleRestart"]
    assert shrink.status["roles"]["reward"]["restarts"] == 0
    assert "pendingChanges" not in shrink.status and shrink.status["roles"]["reward"]["members"] == {"u-w1": "w1"}
    # the group is at 1, naming w0, which KubeRay has yet to delete: the operator still leaves it to KubeRay
    named = Observed("rc", two, reports(1, ["w1"]), applied_spec=built, groups={**seen.groups, "reward": 1},
                     given_up={"reward": ("w0",)})
    pending = decide(job(reward=1), 2, shrink.status, named, T1)
    assert pending.delete_pods == () and pending.status["roles"]["reward"]["restarts"] == 0
    # KubeRay deletes them (the group is at 1 now): still no failure, the role stays Running
    gone = Observed("rc", pods(["w0", "w1"], deleting=frozenset({"w0"})), reports(1, ["w1"]),
                    applied_spec=built, groups={**seen.groups, "reward": 1})
    after = decide(job(reward=1), 2, shrink.status, gone, T1)
    assert after.status["roles"]["reward"]["restarts"] == 0 and after.status["phase"] == "Running"
    assert after.leaving == {} and not after.delete_pods
    final = decide(job(reward=1), 2, after.status, Observed("rc", pods(["w1"]), reports(1, ["w1"]),
                                                            applied_spec=built, groups=gone.groups), T1)
    assert final.status["roles"]["reward"]["restarts"] == 0 and final.status["roles"]["reward"]["ready"] == 1

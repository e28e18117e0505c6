"""Pods -> role health, without a server."""

from __future__ import annotations

from typing import Any

import pytest

from kuberl_operator.health import LastWords, PodView, Tracking, assess_role, pod_failure, pod_ready, pod_view


def pod(phase: str = "Running", ready: bool = True, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "uid": "u", "labels": {"kuberl.io/role": "critic"},
                     "ownerReferences": [{"uid": "rc", "controller": True}]},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}], **status},
    }


def terminated(code: int, reason: str) -> list[dict[str, Any]]:
    return [{"name": "ray-worker", "state": {"terminated": {"exitCode": code, "reason": reason}}}]


@pytest.mark.parametrize("body, expected", [
    (pod(), None),
    (pod("Pending", False), None),
    (pod("Failed", False, containerStatuses=terminated(137, "OOMKilled")), "container ray-worker OOMKilled"),
    (pod("Running", False, containerStatuses=terminated(1, "Error")),
     "container ray-worker exited with code 1 (Error)"),
    (pod("Failed", False, reason="Evicted", message="low on memory"), "evicted: low on memory"),
    (pod("Failed", False), "pod failed"),
    (pod("Failed", False, conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
                                       "message": "PodGC: node no longer exists"}]),
     "pod failed (DeletionByPodGC: PodGC: node no longer exists)"),
    (pod("Succeeded", False), "worker exited"),
    ({**pod(), "metadata": {**pod()["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}, "deleted"),
    # KubeRay deletes a worker pod once it failed: being deleted, it still says how it failed
    ({**pod("Failed", False, containerStatuses=terminated(1, "Error")),
      "metadata": {**pod()["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}},
     "container ray-worker exited with code 1 (Error)"),
    (pod("Unknown", False), "node lost (pod phase Unknown)"),
    # the node controller's mark on a NotReady node's pods: Ready False with no reason, containers still ready
    (pod("Running", False, containerStatuses=[{"name": "ray-worker", "ready": True, "state": {"running": {}}}]),
     "node lost (node NotReady: the node controller marked the pod not ready)"),
    # the kubelet's own not-ready (a container not ready, with a reason) is not a lost node
    (pod("Running", True, conditions=[{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
         containerStatuses=[{"name": "ray-worker", "ready": False, "state": {"running": {}}}]), None),
])
def test_pod_failure_modes(body: dict[str, Any], expected: str | None) -> None:
    assert pod_failure(body) == expected


def test_pod_view_reads_role_owner_and_readiness() -> None:
    view = pod_view(pod())
    assert (view.role, view.owner, view.ready, view.failure, view.deleting) == ("critic", "rc", True, None, False)
    assert not pod_ready(pod("Running", False)) and not pod_ready(pod("Pending", True))


def view(name: str, failure: str | None = None, ready: bool = True, deleting: bool = False) -> PodView:
    return PodView(name=name, uid=f"uid-{name}", role="critic", owner="rc", ready=ready, failure=failure,
                   deleting=deleting)


def test_healthy_pods_become_members() -> None:
    health = assess_role([view("a"), view("b", ready=False)], Tracking())
    assert (health.ready, health.failures, health.doomed) == (1, (), ())
    assert health.tracking == Tracking({"uid-a": "a", "uid-b": "b"}, frozenset())


def test_one_failure_dooms_the_gang_and_counts_once() -> None:
    start = assess_role([view("a"), view("b")], Tracking()).tracking
    first = assess_role([view("a", "container ray-worker OOMKilled"), view("b")], start)
    assert first.failures == ("pod a: container ray-worker OOMKilled",)
    assert first.doomed == ("a", "b") and first.ready == 0
    assert first.tracking.handled == {"uid-a", "uid-b"} and not first.tracking.members

    # Re-assessing the same world (a re-reconcile, an operator restart) counts nothing new,
    # and keeps asking for the pods that are not gone yet.
    again = assess_role([view("a", "container ray-worker OOMKilled"), view("b", deleting=True)], first.tracking)
    assert again.failures == () and again.doomed == ("a",)
    gone = assess_role([], again.tracking)
    assert gone.failures == () and gone.tracking == Tracking()

    # Replacements are new members; their failure is a new restart.
    fresh = assess_role([view("c"), view("d")], gone.tracking)
    assert fresh.failures == () and fresh.ready == 2


def test_a_replacement_made_after_the_failure_is_spared() -> None:
    # KubeRay replaces a failed worker at once (c): it joined after the failure, so it is not of the gang.
    start = assess_role([view("a"), view("b")], Tracking()).tracking
    failed = view("a", "container ray-worker exited with code 1")
    health = assess_role([failed, view("b"), view("c", ready=False)], start)
    assert len(health.failures) == 1 and health.doomed == ("a", "b")
    assert health.tracking == Tracking({"uid-c": "c"}, frozenset({"uid-a", "uid-b"}))


def test_a_vanished_member_is_a_deletion() -> None:
    start = assess_role([view("a"), view("b")], Tracking()).tracking
    health = assess_role([view("b")], start)
    assert health.failures == ("pod a: deleted",) and health.doomed == ("b",)


def test_a_vanished_member_seen_failing_before_it_went_is_named_by_its_failure() -> None:
    # The pod failed and KubeRay deleted it before a pass saw it failed: the failure its last state showed is kept.
    start = assess_role([view("a"), view("b")], Tracking()).tracking
    words = LastWords(keep=2)
    for uid in ("uid-x", "uid-a", "uid-y"):
        words.note(uid, f"container ray-worker exited with code 1 ({uid})")
    words.note("uid-b", "deleted")  # a deletion says nothing more than the vanishing does
    assert list(words.words) == ["uid-a", "uid-y"]  # the newest `keep`
    health = assess_role([view("b")], start, gone=words.words)
    assert health.failures == ("pod a: container ray-worker exited with code 1 (uid-a)",)
    assert health.doomed == ("b",)


def test_simultaneous_failures_are_one_restart() -> None:
    start = assess_role([view("a"), view("b")], Tracking()).tracking
    health = assess_role([view("a", "pod failed"), view("b", "evicted")], start)
    assert len(health.failures) == 2 and health.doomed == ("a", "b")


def test_tracking_round_trips_through_status() -> None:
    tracking = Tracking({"u1": "p1"}, frozenset({"u2"}))
    assert Tracking.from_status(tracking.to_status()) == tracking
    assert tracking.to_status() == {"members": {"u1": "p1"}, "handledUIDs": ["u2"]}


def test_with_a_standby_only_the_failed_pod_goes() -> None:
    start = assess_role([view("a"), view("b"), view("s")], Tracking(), gang=False).tracking
    first = assess_role([view("a", "container ray-worker exited with code 1"), view("b"), view("s")], start, gang=False)
    assert first.failures == ("pod a: container ray-worker exited with code 1",) and first.doomed == ("a",)
    assert first.ready == 2 and first.tracking.members == {"uid-b": "b", "uid-s": "s"}
    # KubeRay's replacement (the next standby) joins; nothing more is counted.
    after = assess_role([view("b"), view("s"), view("n")], first.tracking, gang=False)
    assert after.failures == () and after.ready == 3 and after.doomed == ()

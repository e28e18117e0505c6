"""The lifecycle fields and conditions the ecosystem has (batch Job, JobSet, Kubeflow Trainer), decided purely:
spec.activeDeadlineSeconds, spec.ttlSecondsAfterFinished, status.startTime and completionTime, the Admitted and
Progressing conditions, and status.trainerStatus."""

from __future__ import annotations

from typing import Any

import pytest

from kuberl.spec import SpecInvalid, validate_manifest
from kuberl.spec.contract import ProgressDocument
from kuberl_operator.progress import DriverOutcome
from kuberl_operator.status import Observed, decide, refused_status, ttl_expired

from .test_status import T0, T1, T2, cond, pods


def lifecycle(suspend: bool = False, **spec: Any):
    return validate_manifest({
        "apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
        "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "m.n:f"}, "suspend": suspend,
                 "roles": {"critic": {"replicas": 2}}, **spec},
    })


def test_an_active_job_fails_past_its_deadline_counted_from_its_start() -> None:
    spec = lifecycle(activeDeadlineSeconds=90)
    started = decide(spec, 1, {}, Observed("rc", pods()[:2]), T0).status
    assert started["startTime"] == T0 and started["phase"] == "Provisioning"
    running = decide(spec, 1, started, Observed("rc", pods()), T1).status  # 60 s: within
    assert running["phase"] == "Running" and running["startTime"] == T0  # a phase change keeps the clock
    over = decide(spec, 1, running, Observed("rc", pods()), T2)  # 120 s > 90 s
    failed = cond(over.status, "Failed")
    assert over.status["phase"] == "Failed" and failed["reason"] == "DeadlineExceeded"
    assert "spec.activeDeadlineSeconds (90s)" in failed["message"] and f"active since {T0}" in failed["message"]
    assert over.teardown and over.status["completionTime"] == T2
    assert [(e.type, e.reason) for e in over.events] == [("Warning", "DeadlineExceeded")]
    # No deadline: the same job runs on.
    assert decide(lifecycle(), 1, running, Observed("rc", pods()), T2).status["phase"] == "Running"


def test_a_suspend_stops_the_clock_and_a_resume_starts_it_again() -> None:
    spec = lifecycle(activeDeadlineSeconds=90)
    running = decide(spec, 1, {}, Observed("rc", pods()), T0).status
    suspended = decide(lifecycle(True, activeDeadlineSeconds=90), 1, running, Observed(None), T1).status
    assert suspended["phase"] == "Suspended" and "startTime" not in suspended
    resumed = decide(spec, 1, suspended, Observed("rc", pods()), T2).status  # 120 s after the first start
    assert resumed["phase"] == "Running" and resumed["startTime"] == T2


def test_admitted_and_progressing_follow_suspend_and_the_end() -> None:
    spec = lifecycle()
    suspended = decide(lifecycle(True), 1, {}, Observed(None), T0).status
    assert (cond(suspended, "Admitted")["status"], cond(suspended, "Admitted")["reason"]) == ("False", "Suspended")
    assert cond(suspended, "Progressing")["status"] == "False"
    running = decide(spec, 2, suspended, Observed("rc", pods()), T1).status
    admitted = cond(running, "Admitted")
    assert (admitted["status"], admitted["reason"], admitted["observedGeneration"]) == ("True", "Admitted", 2)
    assert (cond(running, "Progressing")["status"], cond(running, "Progressing")["reason"]) == ("True", "Running")
    done = Observed("rc", pods(), driver=DriverOutcome(succeeded=True, message="the driver exited 0"))
    ended = decide(spec, 2, running, done, T2).status
    progressing = cond(ended, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "JobSucceeded")
    assert ended["completionTime"] == T2 and cond(ended, "Admitted")["status"] == "True"
    refused = refused_status({}, 1, "InvalidSpec", "spec.data: missing", T0)
    assert cond(refused, "Admitted")["reason"] == "InvalidSpec" and refused["completionTime"] == T0


def test_trainer_status_says_how_far_how_long_and_the_last_metrics() -> None:
    spec = lifecycle()
    report = ProgressDocument(step=30, total_steps=120, step_seconds=2.5, metrics={"rewardMean": 0.42})
    first = decide(spec, 1, {}, Observed("rc", pods(), progress=report), T0).status
    assert first["trainerStatus"] == {"progressPercentage": 25, "estimatedRemainingSeconds": 225,
                                      "metrics": {"rewardMean": 0.42}, "lastUpdatedTime": T0}
    same = decide(spec, 1, first, Observed("rc", pods(), progress=report), T1).status
    assert same["trainerStatus"]["lastUpdatedTime"] == T0  # the same step: when it was first seen
    later = ProgressDocument(step=31, total_steps=120)
    moved = decide(spec, 1, same, Observed("rc", pods(), progress=later), T2).status
    assert moved["trainerStatus"] == {"progressPercentage": 25, "lastUpdatedTime": T2}  # no step time: no ETA


def test_a_finished_job_expires_after_its_ttl_only() -> None:
    done = {"completionTime": T0}
    assert not ttl_expired({}, done, T2)  # no TTL: kept
    assert not ttl_expired({"ttlSecondsAfterFinished": 180}, done, T2)
    assert ttl_expired({"ttlSecondsAfterFinished": 120}, done, T2)
    assert ttl_expired({"ttlSecondsAfterFinished": 0}, done, T0)
    assert not ttl_expired({"ttlSecondsAfterFinished": 0}, {}, T2)  # not finished
    assert not ttl_expired({"ttlSecondsAfterFinished": True}, done, T2)  # a bool is no number of seconds


@pytest.mark.parametrize(("field", "value", "words"), [
    ("activeDeadlineSeconds", 0, "must be >= 1"), ("activeDeadlineSeconds", 1.5, "integer"),
    ("ttlSecondsAfterFinished", -1, "must be >= 0"), ("managedBy", "Kueue!", "must match")])
def test_lifecycle_fields_are_refused_by_name(field: str, value: Any, words: str) -> None:
    with pytest.raises(SpecInvalid) as err:
        lifecycle(**{field: value})
    assert f"spec.{field}" in str(err.value) and words in str(err.value)


def queued(**spec: Any):
    return validate_manifest({
        "apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob",
        "metadata": {"name": "j", "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
        "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "m.n:f"},
                 "roles": {"critic": {"replicas": 2}}, **spec},
    })


def test_a_job_kueue_holds_is_pending_not_admitted_and_its_clock_waits() -> None:
    spec = queued(activeDeadlineSeconds=90)
    before = decide(spec, 1, {}, Observed(None), T0).status  # its RayCluster not made yet: not admitted either
    assert cond(before, "Admitted")["status"] == "False"
    waiting = decide(spec, 1, before, Observed("rc", queued=True), T0)
    st = waiting.status
    assert st["phase"] == "Pending" and "startTime" not in st and not waiting.events
    admitted = cond(st, "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "Queued")
    assert admitted["message"] == "waiting for Kueue to admit its workload (LocalQueue team-a)"
    assert cond(st, "Progressing")["status"] == "False"
    # admitted: Kueue unsuspends the RayCluster; the clock starts then, long after the job was made
    running = decide(spec, 1, st, Observed("rc", pods()), T2).status
    assert running["phase"] == "Running" and running["startTime"] == T2
    assert cond(running, "Admitted")["message"] == "Kueue admitted its workload (LocalQueue team-a)"


def test_a_job_kueue_takes_back_says_so_once_and_waits_to_be_readmitted() -> None:
    spec = queued()
    running = decide(spec, 1, {}, Observed("rc", pods()), T0).status
    evicted = decide(spec, 1, running, Observed("rc", queued=True), T1)
    assert evicted.status["phase"] == "Pending" and "startTime" not in evicted.status
    assert cond(evicted.status, "Admitted")["reason"] == "Evicted"
    assert "resumes from its last checkpoint when readmitted" in cond(evicted.status, "Ready")["message"]
    assert [(e.type, e.reason) for e in evicted.events] == [("Warning", "Evicted")]
    again = decide(spec, 1, evicted.status, Observed("rc", queued=True), T2)  # still held: no second Event
    assert cond(again.status, "Admitted")["reason"] == "Evicted" and not again.events
    # admitted, then waiting for room (gang scheduling) when Kueue's waitForPodsReady takes it back: Evicted too
    waiting = decide(spec, 1, {}, Observed("rc", gang_wait="all 6 pods wait"), T0).status
    assert waiting["phase"] == "Pending" and cond(waiting, "Admitted")["status"] == "True"
    taken = decide(spec, 1, waiting, Observed("rc", queued=True), T1)
    assert cond(taken.status, "Admitted")["reason"] == "Evicted" and [e.reason for e in taken.events] == ["Evicted"]

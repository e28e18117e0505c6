"""Observations -> status and actions, without a server: phases, conditions, restarts, progress."""

from __future__ import annotations

from typing import Any

from kuberl.spec import validate_manifest
from kuberl.spec.contract import RoleProgress
from kuberl_operator import conditions
from kuberl_operator.health import PodView
from kuberl_operator.progress import DriverOutcome, Progress, driver_outcome, parse_progress
from kuberl_operator.status import Observed, decide, invalid_spec_status, merge_diff

T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"


def job(suspend: bool = False, critic_budget: int = 1):
    return validate_manifest({
        "apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
        "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "m.n:f"}, "suspend": suspend,
                 "roles": {"critic": {"replicas": 2, "maxRestarts": critic_budget}}},
    })


def pods(cluster: str = "rc", failed: dict[str, str] | None = None) -> tuple[PodView, ...]:
    """One ready pod per role, two critics (c0, c1); ``failed`` maps pod name -> reason."""
    names = {"actor": ["a0"], "critic": ["c0", "c1"], "ref": ["r0"], "reward": ["w0"]}
    failed = failed or {}
    return tuple(PodView(name=n, uid=f"u-{n}", role=role, owner=cluster, ready=n not in failed,
                         failure=failed.get(n), deleting=False)
                 for role, ns in names.items() for n in ns)


def run(old: dict[str, Any], seen: Observed, now: str = T1, **kw: Any):
    return decide(job(**kw), 1, old, seen, now)


def cond(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return conditions.find(status.get("conditions", []), type_)


def test_pending_then_provisioning_then_running() -> None:
    pending = run({}, Observed(cluster_uid=None)).status
    assert pending["phase"] == "Pending" and cond(pending, "Ready")["reason"] == "WaitingForRayCluster"
    prov = run(pending, Observed("rc", pods()[:2])).status
    assert prov["phase"] == "Provisioning" and "critic 1/2" in prov["message"]
    assert prov["rayCluster"] == "j" and prov["roles"]["critic"]["desired"] == 2
    decision = run(prov, Observed("rc", pods()), now=T2)
    running = decision.status
    assert running["phase"] == "Running" and cond(running, "Ready")["status"] == "True"
    assert cond(running, "Ready")["lastTransitionTime"] == T2 and cond(running, "Ready")["observedGeneration"] == 1
    assert [e.reason for e in decision.events] == ["Running"]
    # Nothing changes: no new event, the same transition time, nothing to write.
    again = decide(job(), 1, running, Observed("rc", pods()), "2026-01-01T09:00:00Z")
    assert again.events == () and merge_diff(running, again.status) is None


def test_a_failure_restarts_the_role_once_and_only_its_pods_go() -> None:
    running = run(run({}, Observed("rc", pods())).status, Observed("rc", pods())).status
    decision = run(running, Observed("rc", pods(failed={"c0": "container ray-worker OOMKilled"})))
    st = decision.status
    assert st["phase"] == "Restarting" and st["roles"]["critic"]["restarts"] == 1 and st["restarts"] == 1
    assert decision.delete_pods == ("c0", "c1")
    assert "OOMKilled" in st["roles"]["critic"]["lastFailure"]
    assert [e.reason for e in decision.events] == ["RoleRestart"] and decision.events[0].type == "Warning"
    # Seen again (a re-reconcile): no second count, the deletions are asked for again.
    again = run(st, Observed("rc", pods(failed={"c0": "container ray-worker OOMKilled"})))
    assert again.status["roles"]["critic"]["restarts"] == 1 and again.events == () and again.delete_pods == ("c0", "c1")
    # Replacements come up: Running again, still one restart.
    fresh = tuple(p for p in pods() if p.role != "critic") + (
        PodView("c2", "u-c2", "critic", "rc", True, None, False),
        PodView("c3", "u-c3", "critic", "rc", True, None, False))
    back = run(again.status, Observed("rc", fresh)).status
    assert back["phase"] == "Running" and back["roles"]["critic"]["restarts"] == 1


def test_restarting_lasts_until_the_role_is_ready_again() -> None:
    running = run(run({}, Observed("rc", pods())).status, Observed("rc", pods())).status
    restarting = run(running, Observed("rc", pods(failed={"c1": "pod failed"}))).status
    others = tuple(p for p in pods() if p.role != "critic")
    assert run(restarting, Observed("rc", others)).status["phase"] == "Restarting"


def test_the_budget_is_the_number_of_restarts_allowed() -> None:
    st = run({}, Observed("rc", pods())).status
    st = run(st, Observed("rc", pods(failed={"c0": "evicted"}))).status
    assert st["phase"] == "Restarting"
    st = run(st, Observed("rc", ())).status
    fresh = tuple(p for p in pods() if p.role != "critic") + (PodView("c9", "u-c9", "critic", "rc", True, None, False),)
    st = run(st, Observed("rc", fresh)).status
    failed = PodView("c9", "u-c9", "critic", "rc", False, "pod failed", False)
    decision = run(st, Observed("rc", (*fresh[:-1], failed)))
    assert decision.status["phase"] == "Failed" and cond(decision.status, "Failed")["reason"] == "ReachedMaxRestarts"
    assert "spec.roles.critic.maxRestarts (1)" in cond(decision.status, "Failed")["message"]
    assert decision.teardown and decision.delete_pods == ()
    assert "ReachedMaxRestarts" in [e.reason for e in decision.events]
    restart = next(e.message for e in decision.events if e.reason == "RoleRestart")
    assert "no restart: failure 2 spends spec.roles.critic.maxRestarts (1)" in restart, restart


def test_terminal_conditions_are_sticky() -> None:
    failed = {"phase": "Failed", "conditions": [{"type": "Failed", "status": "True", "reason": "InvalidSpec",
                                                 "message": "x", "lastTransitionTime": T0}]}
    decision = run(failed, Observed("rc", pods()))
    assert decision.status == failed and decision.events == () and decision.teardown
    assert not run(failed, Observed(None)).teardown


def test_suspended_counts_nothing_and_forgets_pods() -> None:
    running = run(run({}, Observed("rc", pods())).status, Observed("rc", pods())).status
    decision = run(running, Observed("rc", pods(failed={"c0": "deleted"})), suspend=True)
    st = decision.status
    assert st["phase"] == "Suspended" and cond(st, "Suspended")["status"] == "True"
    assert st["restarts"] == 0 and decision.delete_pods == () and st["roles"]["critic"]["members"] == {}
    resumed = run(st, Observed(None)).status
    assert resumed["phase"] == "Pending" and cond(resumed, "Suspended")["status"] == "False"


def test_pods_of_an_old_cluster_are_ignored_and_a_new_cluster_starts_clean() -> None:
    running = run(run({}, Observed("rc", pods())).status, Observed("rc", pods())).status
    # The RayCluster was replaced (resume): the old members vanished, which is no failure.
    decision = run(running, Observed("rc2", pods(cluster="old", failed={"c0": "pod failed"})))
    assert decision.status["restarts"] == 0 and decision.delete_pods == ()
    assert decision.status["rayClusterUID"] == "rc2" and decision.status["phase"] == "Provisioning"


def test_driver_outcome_and_progress() -> None:
    seen = Observed("rc", pods(), Progress(step=3, total_steps=10, tokens_per_sec=99.5, message="step 3/10",
                                           roles={"critic": RoleProgress(restarts=2)}, resumed_from=2, steps_lost=4))
    st = run({}, seen, critic_budget=3).status
    assert (st["step"], st["totalSteps"], st["tokensPerSec"], st["message"]) == (3, 10, 99.5, "step 3/10")
    assert (st["resumedFrom"], st["stepsLost"]) == (2, 4)  # a driver that resumed says what it lost
    assert st["roles"]["critic"]["restarts"] == 2 and st["roles"]["critic"]["podRestarts"] == 0

    done = run(st, Observed("rc", pods(), driver=DriverOutcome(True, "the driver finished")), critic_budget=3)
    assert done.status["phase"] == "Succeeded" and cond(done.status, "Succeeded")["reason"] == "DriverSucceeded"
    assert done.teardown
    broke = run(st, Observed("rc", pods(), driver=DriverOutcome(False, "the driver Job failed: boom")), critic_budget=3)
    assert broke.status["phase"] == "Failed" and cond(broke.status, "Failed")["reason"] == "DriverFailed"
    # A driver that ends because the job was suspended does not end the job.
    suspended = run(st, Observed(None, driver=DriverOutcome(False, "x")), suspend=True, critic_budget=3)
    assert suspended.status["phase"] == "Suspended"


def test_the_drivers_account_of_a_failure_names_the_reason() -> None:
    report = Progress(step=0, phase="Failed", reason="PlacementDegraded", message="role actor: worst GPU link SYS",
                      roles={"actor": RoleProgress(worst_link="SYS")})
    decision = run({}, Observed("rc", pods(), report, DriverOutcome(False, "the driver Job failed: exit 3")))
    st = decision.status
    assert (st["phase"], cond(st, "Failed")["reason"]) == ("Failed", "PlacementDegraded")
    assert cond(st, "PlacementDegraded")["status"] == "True"
    assert cond(st, "Failed")["message"] == "role actor: worst GPU link SYS (the driver Job failed: exit 3)"
    assert st["roles"]["actor"]["worstLink"] == "SYS"
    # A report that is not a failure does not explain one.
    running = Progress(phase="Running", reason="PlacementDegraded")
    plain = run({}, Observed("rc", pods(), running, DriverOutcome(False, "the driver Job failed: OOM"))).status
    assert cond(plain, "Failed")["reason"] == "DriverFailed" and cond(plain, "PlacementDegraded") is None


def test_a_failure_the_driver_reports_is_the_roles_last_failure_with_one_event() -> None:
    hang = "WorkerHung at step 3 (values): role critic rank 1 hung in user code: score at my/reward.py:12"
    seen = Observed("rc", pods(), Progress(phase="Running", roles={"critic": RoleProgress(last_failure=hang)}))
    first = run({}, seen)
    critic = first.status["roles"]["critic"]
    assert critic["lastFailure"] == f"{T1}: {hang}" and critic["driverFailure"] == hang
    assert [e.reason for e in first.events].count("RoleFailed") == 1
    assert any(e.message == f"role critic (reported by the driver): {hang}" for e in first.events)
    again = run(first.status, seen, now="2026-01-01T00:05:00Z")  # the same report: no new Event, same text
    assert "RoleFailed" not in [e.reason for e in again.events]
    assert again.status["roles"]["critic"]["lastFailure"] == f"{T1}: {hang}"


def test_invalid_spec_status_names_the_field() -> None:
    st = invalid_spec_status({}, 3, "spec.roles.actor.gpus: must be >= 0", T0)
    assert st["phase"] == "Failed"
    failed = cond(st, "Failed")
    assert (failed["reason"], failed["observedGeneration"], failed["lastTransitionTime"]) == ("InvalidSpec", 3, T0)
    assert "spec.roles.actor.gpus" in failed["message"] and conditions.terminal(st["conditions"]) == "Failed"


def test_set_condition_keeps_order_and_transition_time() -> None:
    conds = conditions.set_condition([], "A", True, "R", "m", 1, T0)
    conds = conditions.set_condition(conds, "B", False, "R", "m", 1, T0)
    conds = conditions.set_condition(conds, "A", True, "R2", "m2", 2, T1)
    assert [c["type"] for c in conds] == ["A", "B"]
    assert conds[0] == {"type": "A", "status": "True", "reason": "R2", "message": "m2",
                        "observedGeneration": 2, "lastTransitionTime": T0}
    assert conditions.set_condition(conds, "A", False, "R", "m", 2, T2)[0]["lastTransitionTime"] == T2


def test_merge_diff() -> None:
    assert merge_diff({"a": 1, "b": {"c": 1, "d": 2}}, {"a": 1, "b": {"c": 2}}) == {"b": {"c": 2, "d": None}}
    assert merge_diff({"a": [1]}, {"a": [1, 2], "e": {}}) == {"a": [1, 2], "e": {}}
    assert merge_diff({"a": {"b": 1}}, {"a": {"b": 1}}) is None


def test_progress_parsing_is_tolerant() -> None:
    assert parse_progress(None) == Progress()
    assert parse_progress("not json") == parse_progress("[1]") == Progress(refused=("progress",))
    got = parse_progress('{"step": 4, "totalSteps": "x", "tokensPerSec": 10, "phase": 3, "reason": "not a reason!", '
                         '"roles": {"ref": {"restarts": 2, "worstLink": "PIX"}, "x": 1}}')
    assert got == Progress(step=4, tokens_per_sec=10.0, roles={"ref": RoleProgress(restarts=2, worst_link="PIX")},
                           refused=("totalSteps", "phase", "reason", "roles.x"))
    assert parse_progress('{"phase": "Failed", "reason": "ReachedMaxRestarts"}').reason == "ReachedMaxRestarts"


def test_driver_outcome_from_job_conditions() -> None:
    assert driver_outcome(None) is None and driver_outcome({"status": {"active": 1}}) is None
    assert driver_outcome({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}).succeeded
    failed = driver_outcome({"status": {"conditions": [{"type": "Failed", "status": "True", "message": "deadline"}]}})
    assert not failed.succeeded and "deadline" in failed.message


def test_every_status_field_written_is_declared_in_the_crd() -> None:
    """A real API server prunes undeclared status fields: the CRD must declare all that decide writes."""
    from kuberl.spec import generate_crd
    from kuberl_operator.status import infeasible_status

    from .schemas import CrdSchema

    schema = CrdSchema(generate_crd(), "v1alpha1")
    report = Progress(step=3, total_steps=10, tokens_per_sec=9.5, message="step 3/10",
                      roles={"ref": RoleProgress(restarts=1), "actor": RoleProgress(worst_link="PIX"),
                             "critic": RoleProgress(worst_link="NV4")}, resumed_from=4, steps_lost=1)
    st = run({}, Observed("rc", pods(), report))
    st = run(st.status, Observed("rc", pods(failed={"c0": "container ray-worker OOMKilled"}), report)).status
    assert {"podRestarts", "members", "handledUIDs", "lastFailure", "worstLink"} <= set(st["roles"]["critic"])
    assert {"rayCluster", "rayClusterUID", "step", "totalSteps", "tokensPerSec", "restarts", "resumedFrom",
            "stepsLost"} <= set(st)
    spec = {"data": {"task": "repeat-letter"}, "reward": {"function": "m.n:f"}}
    for status in (st, invalid_spec_status({}, 1, "x", T0), infeasible_status(st, 1, "y", T0)):
        body = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
                "spec": spec, "status": status}
        assert schema.problems(body) == []
    bogus = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"}, "spec": spec,
             "status": {**st, "roles": {"actor": {"surprise": 1}}}}
    assert any("surprise" in p for p in schema.problems(bogus))  # nothing undeclared slips through


def heads(cluster: str = "rc", failed: str | None = None, name: str = "h0", ready: bool = True) -> tuple[PodView, ...]:
    return (PodView(name=name, uid=f"u-{name}", role=None, owner=cluster, ready=ready and not failed, failure=failed,
                    deleting=False),)


def test_the_head_failing_restarts_the_whole_cluster_and_no_role_counts_it() -> None:
    running = run(run({}, Observed("rc", pods(), head=heads())).status, Observed("rc", pods(), head=heads())).status
    assert running["phase"] == "Running" and running["head"]["ready"] is True
    decision = run(running, Observed("rc", pods(), head=heads(failed="container ray-head exited with code 1")))
    st = decision.status
    assert st["phase"] == "Restarting" and cond(st, "Ready")["reason"] == "RayHeadFailed"
    assert "whole Ray cluster restarts" in st["message"] and "pod h0" in st["message"]
    assert st["head"]["restarts"] == 1 and "pod h0" in st["head"]["lastFailure"] and st["restarts"] == 1
    assert [e.reason for e in decision.events] == ["RayHeadFailed"]
    assert set(decision.delete_pods) == {"h0", "a0", "c0", "c1", "r0", "w0"}  # every pod of the cluster
    assert all(r["restarts"] == 0 for r in st["roles"].values())
    # The workers vanish (deleted by us), the new head is not ready yet: still Restarting, nothing more counted.
    again = run(st, Observed("rc", (), head=heads(name="h1", ready=False)))
    assert again.status["phase"] == "Restarting" and again.status["head"]["restarts"] == 1 and again.events == ()
    assert all(r["restarts"] == 0 for r in again.status["roles"].values())
    new = tuple(PodView(p.name + "n", p.uid + "n", p.role, p.owner, True, None, False) for p in pods())
    back = run(again.status, Observed("rc", new, head=heads(name="h1")))
    assert back.status["phase"] == "Running" and back.status["restarts"] == 1


def test_a_head_that_is_not_ready_keeps_the_job_provisioning() -> None:
    st = run({}, Observed("rc", pods(), head=heads(ready=False))).status
    assert st["phase"] == "Provisioning" and "the Ray head" in st["message"]


def test_a_standby_is_one_more_pod_per_role_and_a_failure_takes_only_the_failed_pod() -> None:
    spec = job().model_copy(deep=True)
    spec.spec.resilience.standby = True
    both = (*pods(), *(PodView(f"s-{r}", f"u-s-{r}", r, "rc", True, None, False) for r in ("actor", "critic", "ref",
                                                                                         "reward")))
    running = decide(spec, 1, decide(spec, 1, {}, Observed("rc", both), T0).status, Observed("rc", both), T0).status
    assert running["phase"] == "Running" and running["roles"]["critic"] == {**running["roles"]["critic"],
                                                                           "desired": 3, "ready": 3, "standby": 1}
    failed = tuple(PodView(p.name, p.uid, p.role, p.owner, p.name != "c0", "container ray-worker exited with code 1"
                           if p.name == "c0" else None, False) for p in both)
    decision = decide(spec, 1, running, Observed("rc", failed), T1)
    assert decision.delete_pods == ("c0",) and decision.status["roles"]["critic"]["restarts"] == 1
    assert "its standby takes the failed pods' place" in decision.events[0].message


def test_a_role_that_leaves_the_jobs_standby_out_has_no_standby_pod_and_restarts_as_a_gang() -> None:
    spec = job().model_copy(deep=True)
    spec.spec.resilience.standby = True
    spec.spec.roles.reward.standby = False
    both = (*pods(), *(PodView(f"s-{r}", f"u-s-{r}", r, "rc", True, None, False) for r in ("actor", "critic", "ref")))
    running = decide(spec, 1, decide(spec, 1, {}, Observed("rc", both), T0).status, Observed("rc", both), T0).status
    assert running["phase"] == "Running" and "standby" not in running["roles"]["reward"]
    assert running["roles"]["reward"]["desired"] == 1 and running["roles"]["critic"]["standby"] == 1
    failed = tuple(PodView(p.name, p.uid, p.role, p.owner, p.role != "reward", "container ray-worker exited with "
                           "code 1" if p.role == "reward" else None, False) for p in both)
    decision = decide(spec, 1, running, Observed("rc", failed), T1)
    assert "restarting the role's pods" in decision.events[0].message


def test_a_pod_that_cannot_start_from_its_image_is_the_roles_last_failure_with_one_event() -> None:
    """Not Running with nothing happening: the kubelet's waiting reason is in the role's status, the phase says
    Provisioning with reason ImagePullFailed, and one Event names it (not one per resync)."""
    why = 'container ray-worker: ErrImageNeverPull (Container image "x:1" is not present with pull policy of Never)'
    stuck = tuple(PodView(**{**p.__dict__, "ready": False, "image": why}) if p.role == "actor" else p for p in pods())
    first = run({}, Observed("rc", stuck))
    actor = first.status["roles"]["actor"]
    assert actor["imageWaiting"] == f"pod a0 {why}" and actor["lastFailure"] == f"{T1}: pod a0 {why}"
    assert first.status["phase"] == "Provisioning" and cond(first.status, "Ready")["reason"] == "ImagePullFailed"
    assert "ErrImageNeverPull" in first.status["message"] and "spec.image" in first.status["message"]
    assert [e.reason for e in first.events] == ["ImagePullFailed"]
    again = run(first.status, Observed("rc", stuck), now=T2)
    assert again.events == () and again.status["roles"]["actor"]["lastFailure"] == f"{T1}: pod a0 {why}"
    fixed = run(again.status, Observed("rc", pods()), now=T2).status
    assert fixed["phase"] == "Running" and "imageWaiting" not in fixed["roles"]["actor"]


def test_image_waiting_reads_the_kubelets_reason() -> None:
    from kuberl_operator.health import image_waiting

    pod = {"status": {"phase": "Pending", "containerStatuses": [
        {"name": "ray-worker", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling"}}}]}}
    assert image_waiting(pod) == "container ray-worker: ImagePullBackOff (Back-off pulling)"
    pod["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ContainerCreating"}}
    assert image_waiting(pod) is None


def resilient(**resilience: Any):
    return validate_manifest({
        "apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
        "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "m.n:f"}, "resilience": resilience,
                 "roles": {"critic": {"replicas": 2, "maxRestarts": 3}}},
    })


def test_a_restart_not_done_within_its_deadline_fails_the_job_naming_the_role() -> None:
    spec = resilient(restartTimeoutSeconds=90)
    running = decide(spec, 1, decide(spec, 1, {}, Observed("rc", pods()), T0).status, Observed("rc", pods()), T0)
    restarting = decide(spec, 1, running.status, Observed("rc", pods(failed={"c0": "deleted"})), T0).status
    assert restarting["phase"] == "Restarting" and restarting["phaseSince"] == T0
    waiting = Observed("rc", tuple(p for p in pods() if p.role != "critic"))  # the new critics never come
    still = decide(spec, 1, restarting, waiting, T1)  # 60 s: within the deadline
    assert still.status["phase"] == "Restarting" and still.status["phaseSince"] == T0
    over = decide(spec, 1, still.status, waiting, T2)  # 120 s > 90 s
    failed = cond(over.status, "Failed")
    assert over.status["phase"] == "Failed" and failed["reason"] == "RestartTimedOut"
    assert "restartTimeoutSeconds (90s)" in failed["message"] and "role critic 0/2" in failed["message"]
    assert [(e.type, e.reason) for e in over.events] == [("Warning", "RestartTimedOut")]
    assert over.teardown and over.status["phaseSince"] == T2


def test_the_restart_deadline_defaults_to_the_start_timeout_and_ten_minutes() -> None:
    assert resilient().spec.resilience.restart_deadline_seconds() == 1800 + 600
    assert resilient(startTimeoutSeconds=60).spec.resilience.restart_deadline_seconds() == 660
    assert resilient(restartTimeoutSeconds=5).spec.resilience.restart_deadline_seconds() == 5


def test_provisioning_past_the_start_timeout_fails_the_job() -> None:
    spec = resilient(startTimeoutSeconds=90)
    prov = decide(spec, 1, decide(spec, 1, {}, Observed("rc", pods()[:2]), T0).status, Observed("rc", pods()[:2]), T0)
    assert prov.status["phase"] == "Provisioning" and prov.status["phaseSince"] == T0
    over = decide(spec, 1, prov.status, Observed("rc", pods()[:2]), T2)
    assert over.status["phase"] == "Failed" and cond(over.status, "Failed")["reason"] == "ProvisioningTimedOut"
    assert "startTimeoutSeconds (90s)" in over.status["message"] and "role ref 0/1" in over.status["message"]
    # Running in time: no deadline; a phase change starts the clock again
    ran = decide(spec, 1, prov.status, Observed("rc", pods()), T1).status
    assert ran["phase"] == "Running" and ran["phaseSince"] == T1
    assert decide(spec, 1, ran, Observed("rc", pods()), "2026-01-01T09:00:00Z").status["phase"] == "Running"

"""The rules `decide` is made of, and the typed status it writes (kuberl.spec.status)."""

from __future__ import annotations

from kuberl.spec.contract import RoleProgress
from kuberl.spec.status import JobStatus
from kuberl_operator import conditions
from kuberl_operator.progress import Progress
from kuberl_operator.status import Observed, decide, not_ready, outcomes, provisioning_phase, restarting_phase

from .test_status import T0, T1, heads, job, pods


def test_set_conditions_sets_each_change_in_turn_on_a_copy() -> None:
    old = [{"type": "Ready", "status": "True", "reason": "AllRolesReady", "message": "m", "observedGeneration": 1,
            "lastTransitionTime": T0}]
    new = conditions.set_conditions(old, [("Failed", True, "X", "x"), ("Ready", False, "JobFailed", "x")], 2, T1)
    assert [(c["type"], c["status"], c["lastTransitionTime"]) for c in new] == [("Ready", "False", T1),
                                                                               ("Failed", "True", T1)]
    assert old[0]["status"] == "True"  # the old list is left as it was
    assert conditions.set_conditions(old, [], 2, T1) == old


def test_what_decide_writes_is_a_job_status_round_trip() -> None:
    """Every status decide writes validates as the model and dumps back the same, field for field."""
    report = Progress(step=3, total_steps=10, tokens_per_sec=9.5, message="step 3/10", resumed_from=4, steps_lost=1,
                      roles={"critic": RoleProgress(restarts=1, worst_link="NV4", last_failure="hung", replicas=2)})
    st = decide(job(), 1, {}, Observed(cluster_uid=None), T0).status
    for seen in (Observed("rc", pods(), report, head=heads()),
                 Observed("rc", pods(failed={"c0": "pod failed"}), report, head=heads(failed="pod failed"))):
        st = decide(job(), 1, st, seen, T1).status
        assert JobStatus.model_validate(st).to_status() == st
    suspended = decide(job(suspend=True), 2, st, Observed("rc", pods()), T1).status
    assert JobStatus.model_validate(suspended).to_status() == suspended


def test_the_phase_rules_restarting_before_provisioning() -> None:
    """Pods not ready (the head first) make the job Provisioning, unless a role failed this pass, or failed before
    and is not ready again (the previous Ready condition says so): then it is Restarting."""
    j = job()
    seen = Observed("rc", pods()[:3], head=heads(ready=False))  # ref and reward have no pod yet
    head, roles = outcomes(j, {"rayClusterUID": "rc"}, seen, T1, ("critic",))
    waiting = not_ready(roles, head)
    assert waiting == ["the Ray head", "ref 0/1", "reward 0/1"]
    assert restarting_phase(roles, {}, head, waiting) is None
    assert provisioning_phase(j, roles, waiting) == ("Provisioning", "RolesNotReady",
                                                     "waiting for pods: the Ray head, ref 0/1, reward 0/1")
    ready = {"reason": "RoleRestarting", "message": "restarting ref"}
    assert restarting_phase(roles, ready, head, waiting) == ("Restarting", "RoleRestarting", "restarting ref")
    failed = Observed("rc", pods(failed={"c0": "pod failed"}), head=heads())
    head, roles = outcomes(j, {"rayClusterUID": "rc"}, failed, T1, ("critic",))
    assert restarting_phase(roles, {}, head, not_ready(roles, head)) == ("Restarting", "RoleRestarting",
                                                                         "restarting critic")

"""The runtime/operator contract: one budget rule, exit codes the driver Job's policy names, the progress document."""

from __future__ import annotations

import json

import pytest

from kuberl.spec.contract import ExitCode, ProgressDocument, Reason, RoleProgress, restart_budget_spent


@pytest.mark.parametrize("max_restarts, failures, spent", [(0, 1, True), (1, 1, False), (1, 2, True), (3, 3, False),
                                                           (3, 4, True)])
def test_max_restarts_restarts_are_allowed_and_the_next_failure_ends_the_job(max_restarts, failures, spent):
    assert restart_budget_spent(failures, max_restarts) is spent


def test_reasons_are_kubernetes_condition_reasons():
    from kuberl.spec.contract import REASON_PATTERN

    assert all(REASON_PATTERN.match(r.value) for r in Reason)
    assert f"{Reason.REACHED_MAX_RESTARTS}" == "ReachedMaxRestarts"


def test_exit_codes_the_driver_job_fails_on():
    from kuberl.spec import validate_manifest
    from kuberl_operator.builders import BuildOptions, driver_job

    job = validate_manifest({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
                             "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "m.n:f"}}})
    rules = driver_job(job, BuildOptions(namespace="ns"))["spec"]["podFailurePolicy"]["rules"]
    assert rules[0]["onExitCodes"]["values"] == [ExitCode.BAD_INPUT, ExitCode.GAVE_UP] == [1, 3]


def test_a_crash_exits_with_a_code_the_driver_job_retries(monkeypatch, capsys):
    """An error nothing expected (on Kubernetes: the Ray cluster gone with its head, which Ray's client reports
    as it pleases) is no bad input: its traceback and exit 5, which the podFailurePolicy leaves to the retries
    (Python's own exit code for an uncaught exception is 1, bad input's)."""
    from kuberl import cli

    def crash(args):
        raise RuntimeError("the GCS has restarted")

    monkeypatch.setattr(cli, "cmd_crd", crash)
    assert cli.main(["crd"]) == ExitCode.CRASHED == 5
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: the GCS has restarted" in err
    assert err.rstrip().endswith("kuberl crd: crashed (exit 5)")


def test_progress_document_round_trip_and_wire_names():
    doc = ProgressDocument(step=3, total_steps=9, tokens_per_sec=1.5, phase="Failed", message="m",
                           reason=Reason.PLACEMENT_DEGRADED.value,
                           roles={"actor": RoleProgress(restarts=1, worst_link="PIX")})
    wire = json.loads(doc.to_json())
    assert wire == {"step": 3, "totalSteps": 9, "tokensPerSec": 1.5, "phase": "Failed", "message": "m",
                    "reason": "PlacementDegraded", "roles": {"actor": {"restarts": 1, "worstLink": "PIX"}}}
    assert ProgressDocument.parse(doc.to_json()) == doc
    assert doc.restarts_of("actor") == 1 and doc.restarts_of("critic") == 0 and doc.link_of("actor") == "PIX"


def test_progress_parse_drops_each_bad_field_alone():
    text = '{"step": true, "totalSteps": 5, "roles": {"a": {"restarts": "1", "worstLink": "SYS"}}}'
    got = ProgressDocument.parse(text)
    assert got == ProgressDocument(total_steps=5, roles={"a": RoleProgress(worst_link="SYS")},
                                   refused=("step", "roles.a.restarts"))


@pytest.mark.parametrize("text, refused", [
    ('{"step": 3, "tokensPerSec": NaN}', ("tokensPerSec",)),
    ('{"step": 3, "tokensPerSec": Infinity}', ("tokensPerSec",)),
    ('{"step": 3, "tokensPerSec": 1e400}', ("tokensPerSec",)),
    ('{"step": 92233720368547758070, "totalSteps": -1}', ("step", "totalSteps")),
    ('{"step": 3, "message": "%s"}' % ("x" * 5000), ("message",)),
    ('{"step": 3, "phase": "Exploded"}', ("phase",)),
    (json.dumps({"step": 3, "roles": {"a": {"hosts": ["h"] * 5000}}}), ("roles.a.hosts",)),
    (json.dumps({"step": 3, "roles": {f"r{i}": {} for i in range(40)}}), tuple(f"roles.r{i}" for i in range(32, 40))),
    ('{"step": 3, "message": "%s"}' % ("x" * 300_000), ("progress",)),
    ('[' * 5000 + ']' * 5000, ("progress",)),
])
def test_a_driver_cannot_report_what_would_freeze_the_status(text: str, refused: tuple[str, ...]) -> None:
    """User code runs in the driver: a non-finite or out-of-int64 number (which made every status patch fail, the
    job's status frozen), or an unbounded string, list or document is dropped by the reader, and named."""
    got = ProgressDocument.parse(text)
    assert got.refused == refused
    assert json.loads(got.to_json()) == json.loads(got.to_json(), parse_constant=float)  # finite: plain JSON
    if refused != ("progress",):
        assert got.step == 3 or "step" in refused


def test_progress_carries_a_roles_last_failure_and_standby_for_the_operator():
    """lastFailure (one line: reason, step, phase, diagnosis) and standbyReady cross to the operator."""
    from kuberl.metrics.progress import progress_of
    from kuberl.metrics.record import Recovery, RoleStep, StepRecord

    rec = Recovery("critic", 3, "values", Reason.WORKER_HUNG, "hung: no answer within 30s; ...", detect_s=30.0,
                   diagnosis="role critic rank 1 hung in user code: score at myreward.py:12")
    step = StepRecord(step=3, roles={"critic": RoleStep(restarts=1, recoveries=[rec], last_failure=rec.summary(),
                                                        standby_ready=True)})
    doc = progress_of(step, 9)
    wire = json.loads(doc.to_json())["roles"]["critic"]
    assert wire == {"restarts": 1, "standbyReady": True,
                    "lastFailure": "WorkerHung at step 3 (values): role critic rank 1 hung in user code: "
                                   "score at myreward.py:12"}
    assert ProgressDocument.parse(doc.to_json()) == doc
    bad = ProgressDocument.parse('{"roles": {"critic": {"lastFailure": 7, "standbyReady": "yes", "restarts": 2}}}')
    assert bad.roles["critic"] == RoleProgress(restarts=2)

"""The operator's own check of the job policy (job_policy.py): the rules the chart's admission policy states, the
same refusals, and the flag that carries them."""

from __future__ import annotations

import argparse
import copy
import json
from typing import Any

import pytest

from kuberl.spec import validate_manifest
from kuberl_operator import cli
from kuberl_operator.job_policy import JobPolicy, PolicyInvalid, parse, violations
from kuberl_operator.status import policy_denied_status
from tests.policy_cases import DEFAULT_ALLOWED, DEFAULT_REFUSED, STRICT, STRICT_ALLOWED, STRICT_REFUSED

STRICT_POLICY = JobPolicy(**{k: v for k, v in STRICT["jobPolicy"].items() if k != "enabled"})


def job(**spec: Any):
    spec = copy.deepcopy(spec)
    roles = {"actor": {"gpus": 1}}  # a GPU role, as spec.placement.mode dra needs
    for role, fields in spec.pop("roles", {}).items():
        roles[role] = {**roles.get(role, {}), **fields}
    return validate_manifest({
        "apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
        "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "m.n:f"}, "roles": roles,
                 **spec, "trainer": {"microBatchSize": 1, **spec.get("trainer", {})}}})


@pytest.mark.parametrize("spec, words", DEFAULT_REFUSED)
def test_the_default_policy_refuses_what_admission_refuses(spec: dict[str, Any], words: str) -> None:
    problems = violations(job(**spec), JobPolicy())
    assert len(problems) == 1 and words in problems[0], problems
    assert problems[0].startswith("spec."), problems  # names the field


@pytest.mark.parametrize("spec, words", STRICT_REFUSED)
def test_a_platforms_allow_lists_refuse_what_admission_refuses(spec: dict[str, Any], words: str) -> None:
    problems = violations(job(**spec), STRICT_POLICY)
    assert any(words in p for p in problems), problems


def test_what_the_policies_allow_passes() -> None:
    assert violations(job(**DEFAULT_ALLOWED), JobPolicy()) == []
    assert violations(job(**STRICT_ALLOWED), STRICT_POLICY) == []
    assert violations(job(), STRICT_POLICY) == []  # no image, claim or class chosen: the operator's own


def test_a_path_beside_a_forbidden_one_is_not_under_it() -> None:
    ok = {"trainer": {"checkpoint": {"volumeClaim": "c", "path": "/optical"}}}
    assert violations(job(**ok), JobPolicy(forbiddenMountPaths=("/opt",))) == []


def test_every_broken_rule_is_named() -> None:
    spec = {"image": "x/y:1", "roles": {"actor": {"priorityClassName": "p", "tolerations": [{"operator": "Exists"}]}}}
    problems = violations(job(**spec), STRICT_POLICY)
    assert [p.split(" ")[0] for p in problems] == ["spec.image", "spec.roles.<role>.priorityClassName",
                                                   "spec.roles.<role>:"], problems


def test_the_flag_takes_the_charts_json_and_refuses_a_typo() -> None:
    assert parse(json.dumps(STRICT["jobPolicy"] | {}).replace('"enabled": true, ', "")) == STRICT_POLICY
    with pytest.raises(PolicyInvalid, match="allowedImage"):
        parse('{"allowedImage": ["a/"]}')
    with pytest.raises(PolicyInvalid, match="--job-policy"):
        parse("not json")
    with pytest.raises(argparse.ArgumentTypeError, match="--job-policy"):
        cli.policy("[1]")


def test_render_refuses_a_job_the_policy_forbids(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    path = tmp_path / "job.yaml"
    manifest = job(image="docker.io/evil/miner:1").model_dump(by_alias=True, exclude_unset=True, mode="json")
    path.write_text(yaml.safe_dump(manifest))
    policy = json.dumps({"allowedImages": ["reg.example.com/ml/"]})
    assert cli.main(["render", str(path), "--job-policy", policy]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: spec.image must start with one of reg.example.com/ml/" in err, err


def test_the_status_of_a_refused_job_is_failed_policy_denied() -> None:
    st = policy_denied_status({}, 2, "spec.image must start with one of a/", "2026-01-01T00:00:00Z")
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert st["phase"] == "Failed" and failed["reason"] == "PolicyDenied" and failed["status"] == "True"


def test_credential_secrets_are_bounded_by_the_allow_list() -> None:
    creds = {"credentials": {"huggingFace": {"name": "hf-token", "key": "t"}}}
    assert violations(job(**creds), STRICT_POLICY) == []
    assert violations(job(**creds), JobPolicy()) == []  # empty: any Secret of the namespace
    other = {"credentials": {"mlflow": {"name": "db-password", "key": "p"}}}
    assert violations(job(**other), STRICT_POLICY) == [
        "spec.credentials.*.name must be one of hf-token (jobPolicy.allowedCredentialSecrets)"]


def test_the_operators_defaults_are_the_charts() -> None:
    """`kuberl operator` without --job-policy enforces what the chart's default jobPolicy says."""
    import yaml

    from tests.chart.render import CHART

    values = yaml.safe_load((CHART / "values.yaml").read_text())["jobPolicy"]
    assert parse(json.dumps({k: v for k, v in values.items() if k != "enabled"})) == JobPolicy()

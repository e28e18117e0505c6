"""spec.roles.extra: names, worker import paths, enabled roles and faults, the worker class by import path."""

from __future__ import annotations

import pytest

from kuberl.registry import RegistryError
from kuberl.spec import SpecInvalid, enabled_roles, validate_manifest


def job(extra, **spec):
    base = {"data": {"task": "repeat-letter"}, "reward": {"function": "repeat-letter"}, "roles": {"extra": extra}}
    base.update(spec)
    return validate_manifest({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "x"},
                              "spec": base})


RULES = {"worker": "examples.rule_engine:RuleEngineWorker", "resources": {"cpu": "250m"}, "maxRestarts": 1}


def errors(extra, **spec):
    with pytest.raises(SpecInvalid) as info:
        job(extra, **spec)
    return [str(e) for e in info.value.errors]


def test_extra_roles_run_after_the_built_in_ones_and_take_faults():
    spec = job({"rules": RULES}, resilience={"faults": [{"role": "rules", "step": 2}]}).spec
    assert enabled_roles(spec) == ["actor", "critic", "ref", "reward", "rules"]
    assert spec.roles.get("rules").max_restarts == 1 and spec.roles.get("rules").resources.cpu_cores() == 0.25
    assert enabled_roles(job({"rules": {**RULES, "enabled": False}}).spec)[-1] == "reward"


@pytest.mark.parametrize("extra, field, words", [
    ({"critic": RULES}, "spec.roles.extra", "built-in role"),
    ({"Rules": RULES}, "spec.roles.extra", "lowercase letters"),
    ({"rules": {**RULES, "worker": "not a path"}}, "spec.roles.extra.rules.worker", "import path"),
    ({"rules": {"replicas": 1}}, "spec.roles.extra.rules.worker", "is required"),
])
def test_bad_extra_roles_name_the_field(extra, field, words):
    errs = errors(extra)
    hit = [e for e in errs if e.startswith(field + ":")]
    assert hit and words in hit[0], errs


def deep(depth):
    config = {"leaf": 1}
    for _ in range(depth - 1):
        config = {"a": config}
    return config


def test_a_config_is_bounded_in_depth_and_keys():
    """What the chart's job policy and the CRD refuse on a cluster, `kuberl validate` refuses here, with the field
    named; counting is iterative, so even a config deeper than the stack is one line."""
    from kuberl.spec.model import CONFIG_MAX_DEPTH, CONFIG_MAX_KEYS, nesting

    assert nesting(deep(CONFIG_MAX_DEPTH)) == CONFIG_MAX_DEPTH and nesting(1) == 0 and nesting({"r": [{}]}) == 3
    job({"rules": {**RULES, "config": deep(CONFIG_MAX_DEPTH)}})
    for config, words in ((deep(CONFIG_MAX_DEPTH + 1), f"more than {CONFIG_MAX_DEPTH}"), (deep(5000), "deep"),
                          ({f"k{i}": i for i in range(CONFIG_MAX_KEYS + 1)}, f"more than {CONFIG_MAX_KEYS}")):
        (hit,) = [e for e in errors({"rules": {**RULES, "config": config}}) if e.startswith(
            "spec.roles.extra.rules.config:")]
        assert words in hit


def test_a_fault_for_a_role_the_job_lacks_is_refused():
    errs = errors({}, resilience={"faults": [{"role": "rules", "step": 1}]})
    assert any(e.startswith("spec.resilience.faults[0].role: role rules is not running") for e in errs), errs


def test_worker_class_resolves_by_import_path_with_field_named_errors():
    from examples.rule_engine import RuleEngineWorker
    from kuberl.workers import worker_class

    assert worker_class(job({"rules": RULES}).spec, "rules") is RuleEngineWorker
    with pytest.raises(RegistryError, match=r"^spec.roles.extra.rules.worker: module 'examples.rule_engine' has no"):
        worker_class(job({"rules": {**RULES, "worker": "examples.rule_engine:Nope"}}).spec, "rules")
    with pytest.raises(RegistryError, match="is not a kuberl.workers.Worker subclass"):
        worker_class(job({"rules": {**RULES, "worker": "examples.rule_engine:RuleEngine"}}).spec, "rules")

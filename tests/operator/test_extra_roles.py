"""An extra role in the operator: a worker group of its own in the RayCluster, and status per role."""

from __future__ import annotations

from kuberl.spec import validate_manifest
from kuberl_operator.builders import BuildOptions, ray_cluster
from kuberl_operator.health import PodView
from kuberl_operator.status import Observed, decide

T0 = "2026-01-01T00:00:00Z"


def job():
    return validate_manifest({
        "apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
        "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "repeat-letter"},
                 "roles": {"extra": {"rules": {"worker": "examples.rule_engine:RuleEngineWorker", "replicas": 2,
                                               "resources": {"cpu": "250m", "memory": "1Gi"}, "maxRestarts": 0}}}},
    })


def test_the_extra_role_has_its_own_worker_group():
    groups = {g["groupName"]: g for g in ray_cluster(job(), BuildOptions(namespace="ns"))["spec"]["workerGroupSpecs"]}
    assert list(groups) == ["actor", "critic", "ref", "reward", "rules"]
    rules = groups["rules"]
    assert rules["replicas"] == rules["minReplicas"] == rules["maxReplicas"] == 2
    assert '"kuberl_role_rules":1' in rules["rayStartParams"]["resources"]
    assert rules["template"]["metadata"]["labels"]["kuberl.io/role"] == "rules"
    limits = rules["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert {k: limits[k] for k in ("cpu", "memory")} == {"cpu": "250m", "memory": "1Gi"}
    assert "nvidia.com/gpu" not in limits


def test_the_extra_role_has_status_and_its_own_restart_budget():
    pods = tuple(PodView(name=f"{r}0", uid=f"u-{r}", role=r, owner="rc", ready=True, failure=None, deleting=False)
                 for r in ("actor", "critic", "ref", "reward"))
    rules = [PodView(name=f"rules{i}", uid=f"u-rules{i}", role="rules", owner="rc", ready=True, failure=None,
                     deleting=False) for i in range(2)]
    st = decide(job(), 1, {}, Observed("rc", (*pods, *rules)), T0).status
    assert st["roles"]["rules"]["desired"] == 2 and st["roles"]["rules"]["ready"] == 2 and st["phase"] == "Running"
    failed = rules[0].__class__(**{**rules[0].__dict__, "ready": False, "failure": "pod failed"})
    decision = decide(job(), 1, st, Observed("rc", (*pods, failed, rules[1])), T0)
    assert decision.status["phase"] == "Failed"
    assert "spec.roles.extra.rules.maxRestarts (0)" in decision.status["message"]

"""A manifest with Kubernetes placement runs on this machine as it is: one warning names the ignored fields."""

from __future__ import annotations

from pathlib import Path

from kuberl.preflight import ignored_placement
from kuberl.spec import validate_manifest

from .conftest import REPO
from .test_userpath import kuberl, write_job

PLACED = {
    "actor": {"replicas": 1, "resources": {"cpu": "1", "memory": "2Gi"}, "nodeSelector": {"pool": "train"},
              "priorityClassName": "training-high"},
    "critic": {"replicas": 1, "resources": {"cpu": "500m", "memory": "2Gi"},
               "tolerations": [{"key": "pool", "value": "legacy", "effect": "NoSchedule"}]},
    "ref": {"replicas": 1, "resources": {"cpu": "250m", "memory": "1Gi"}, "runtimeClassName": "nvidia",
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}},
    "reward": {"replicas": 1, "resources": {"cpu": "250m", "memory": "1Gi"}},
}


def test_placement_fields_are_ignored_on_local_ray_with_one_warning(netns, tmp_path: Path) -> None:
    job = write_job(tmp_path / "job.yaml", spec__roles=PLACED, spec__trainer__steps=1)
    proc = kuberl("run", str(job), "--backend", "ray", "--no-progress", "--out", str(tmp_path / "out"), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "done: job 'quickstart', 1 steps" in proc.stdout, proc.stdout
    warnings = [line for line in proc.stderr.splitlines() if "scheduling fields" in line]
    assert warnings == [
        "warning: spec.roles.actor (nodeSelector, priorityClassName); spec.roles.critic (tolerations); "
        "spec.roles.ref (affinity, runtimeClassName): Kubernetes scheduling fields, ignored on this machine "
        "(they apply when the operator runs the job)"
    ], proc.stderr


def test_no_warning_without_placement_and_gpu_product_is_named() -> None:
    base = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
            "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "m.n:f"},
                     "trainer": {"microBatchSize": 1}}}
    assert ignored_placement(validate_manifest(base).spec) is None
    gpu = {**base, "spec": {**base["spec"], "roles": {"ref": {"gpus": 1, "gpuProduct": "NVIDIA-L4"}}}}
    assert ignored_placement(validate_manifest(gpu).spec).startswith("warning: spec.roles.ref (gpuProduct): ")


def test_a_local_run_says_where_its_credentials_come_from(monkeypatch) -> None:
    from kuberl.preflight import ignored_credentials

    base = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
            "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "m.n:f"},
                     "credentials": {"wandb": {"name": "wb", "key": "k"}}}}
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    note = ignored_credentials(validate_manifest(base).spec)
    assert note.startswith("note: spec.credentials names Kubernetes Secrets") and "WANDB_API_KEY" in note, note
    monkeypatch.setenv("WANDB_API_KEY", "x")
    assert ignored_credentials(validate_manifest(base).spec) is None

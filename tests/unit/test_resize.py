"""Live resizes, the checks before any worker moves (pure: no Ray)."""

from __future__ import annotations

from pathlib import Path

from kuberl.resilience.resize import shared_storage_problem
from kuberl.spec import parse_yaml, validate_manifest

REPO = Path(__file__).resolve().parents[2]


def test_a_trainable_resize_on_kubernetes_needs_a_shared_checkpoint_volume() -> None:
    spec = validate_manifest(parse_yaml((REPO / "examples" / "quickstart.yaml").read_text())).spec
    assert shared_storage_problem(spec, "critic").startswith(
        "spec.roles.critic.replicas: resizing critic on Kubernetes needs spec.trainer.checkpoint.volumeClaim")
    assert shared_storage_problem(spec, "reward") is None  # a frozen role reloads the model path
    shared = spec.model_copy(update={"trainer": spec.trainer.model_copy(update={
        "checkpoint": spec.trainer.checkpoint.model_copy(update={"volume_claim": "ckpt"})})})
    assert shared_storage_problem(shared, "actor") is None

"""Spec rules for the memory features (offload, LoRA): one-line errors naming the field and the fix."""

from __future__ import annotations

import pytest

from kuberl.spec import SpecInvalid, validate_manifest


def manifest(roles: dict) -> dict:
    spec = {"data": {"task": "repeat-letter"}, "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
            "roles": roles}
    return {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "t"}, "spec": spec}


def errors_of(roles: dict) -> list[str]:
    with pytest.raises(SpecInvalid) as info:
        validate_manifest(manifest(roles))
    return [str(e) for e in info.value.errors]


def test_offload_on_training_roles_is_accepted() -> None:
    job = validate_manifest(manifest({"actor": {"offload": {"params": True, "optimizer": True}},
                                      "critic": {"offload": {"optimizer": True, "reshardAfterForward": False}}}))
    assert job.spec.roles.actor.offload.params and job.spec.roles.critic.offload.reshard_after_forward is False
    assert not job.spec.roles.ref.offload.any


@pytest.mark.parametrize(("roles", "field", "words"), [
    ({"ref": {"offload": {"optimizer": True}}}, "roles.ref.offload", "ref does not train"),
    ({"reward": {"offload": {"reshardAfterForward": True}}}, "roles.reward.offload", "reward does not train"),
    ({"actor": {"offload": {"params": True}}}, "roles.actor.offload.optimizer", "CPUOffloadPolicy"),
    ({"ref": {"lora": {"rank": 8}}}, "roles.ref.lora", "ref does not train: LoRA"),
])
def test_offload_errors_name_the_field(roles: dict, field: str, words: str) -> None:
    (err,) = errors_of(roles)
    assert "\n" not in err and f"spec.{field}" in err and words in err and "fix" in err, err


def test_lora_spec_defaults_and_bad_target() -> None:
    job = validate_manifest(manifest({"actor": {"lora": {"rank": 8, "alpha": 16, "targetModules": ["q_proj"]}}}))
    assert job.spec.roles.actor.lora.enabled and not job.spec.roles.critic.lora.enabled
    (err,) = errors_of({"actor": {"lora": {"rank": 8, "targetModules": ["qproj"]}}})
    assert "spec.roles.actor.lora.targetModules" in err and "\n" not in err, err

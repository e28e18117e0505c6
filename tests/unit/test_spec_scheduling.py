"""The scheduling fields of spec.roles.<role> and the per-role rules: one line each, naming the field."""

from __future__ import annotations

import pytest

from kuberl.spec import enabled_roles, validate_manifest

from .test_spec import errors_of, manifest


def roles(**kw) -> dict:
    return manifest(roles=kw, trainer={"microBatchSize": 1})


def test_every_field_is_read() -> None:
    job = validate_manifest(roles(actor={
        "gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3", "nodeSelector": {"example.com/pool": "a"},
        "tolerations": [{"key": "pool", "operator": "Equal", "value": "a", "effect": "NoExecute",
                         "tolerationSeconds": 30}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "Gt", "values": ["2"]}]}}]}},
        "priorityClassName": "high", "runtimeClassName": "nvidia"}))
    actor = job.spec.roles.actor
    assert actor.node_labels() == {"example.com/pool": "a", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert actor.tolerations[0].toleration_seconds == 30 and actor.affinity.node_affinity is not None
    assert actor.constrained() == ["nodeSelector", "gpuProduct", "tolerations", "affinity", "priorityClassName",
                                   "runtimeClassName"]
    assert validate_manifest(roles()).spec.roles.ref.constrained() == []


@pytest.mark.parametrize("spec, field, words", [
    (roles(ref={"gpuProduct": "NVIDIA-L4"}), "spec.roles.ref.gpuProduct", "no GPUs"),
    (roles(ref={"gpus": 1, "gpuProduct": "NVIDIA L4"}), "spec.roles.ref.gpuProduct", "label value"),
    (roles(ref={"gpus": 1, "gpuProduct": "A", "nodeSelector": {"nvidia.com/gpu.product": "B"}}),
     "spec.roles.ref.gpuProduct", "nodeSelector nvidia.com/gpu.product is B"),
    (roles(critic={"replicas": 0}), "spec.roles.critic.replicas", "ppo (GAE) needs the critic"),
    (roles(actor={"replicas": 0}), "spec.roles.actor.replicas", "needs the actor"),
    (roles(reward={"replicas": 0}), "spec.roles.reward.replicas", "needs the reward"),
    (roles(actor={"replicas": 2, "gpus": 2}) | {"spec": {**roles(actor={"replicas": 2, "gpus": 2})["spec"],
                                                          "rollout": {"tensorParallelSize": 4}}},
     "spec.rollout.tensorParallelSize", "2 replicas x 2 GPUs do not split into groups of 4"),
    (roles(actor={"nodeSelector": {"-bad": "x"}}), "spec.roles.actor.nodeSelector", "label key '-bad'"),
    (roles(actor={"nodeSelector": {"ok": "a b"}}), "spec.roles.actor.nodeSelector", "label value 'a b'"),
    (roles(actor={"tolerations": [{"operator": "Exists", "value": "x"}]}), "spec.roles.actor.tolerations[0]",
     "takes no value"),
    (roles(actor={"tolerations": [{"value": "x"}]}), "spec.roles.actor.tolerations[0]", "needs a key"),
    (roles(actor={"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}]}),
     "spec.roles.actor.tolerations[0]", "NoExecute only"),
    (roles(actor={"tolerations": [{"key": "k", "effect": "Sometimes"}]}), "spec.roles.actor.tolerations[0].effect",
     "NoSchedule"),
    (roles(actor={"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Exists", "values": ["a"]}]}]}}}}),
     "spec.roles.actor.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchExpressions[0]", "takes no values"),
    (roles(actor={"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]}}}),
     "spec.roles.actor.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey", ""),
    (roles(actor={"affinity": {"nodeAfinity": {}}}), "spec.roles.actor.affinity.nodeAfinity", ""),
    (roles(actor={"priorityClassName": "High_Prio"}), "spec.roles.actor.priorityClassName", ""),
    (roles(actor={"runtimeClassName": ""}), "spec.roles.actor.runtimeClassName", ""),
])
def test_bad_placement_is_one_line_naming_the_field(spec: dict, field: str, words: str) -> None:
    errors = errors_of(spec)
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert errors[0].startswith(f"{field}:") and words in errors[0] and "(fix: " in errors[0], errors


def test_a_role_the_algorithm_does_without_may_be_scaled_to_zero() -> None:
    assert enabled_roles(validate_manifest(roles(ref={"replicas": 0})).spec) == ["actor", "critic", "reward"]
    grpo = manifest(algorithm={"name": "grpo", "groupSize": 4}, roles={"critic": {"replicas": 0}})
    assert enabled_roles(validate_manifest(grpo).spec) == ["actor", "ref", "reward"]

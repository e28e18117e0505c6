"""Spec rules for colocation (`spec.roles.<role>.colocateWith`): one-line errors naming the field and the fix."""

from __future__ import annotations

import pytest

from kuberl.spec import SpecInvalid, validate_manifest


def manifest(roles: dict, **spec: object) -> dict:
    body = {"data": {"task": "repeat-letter"}, "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
            "roles": roles, **spec}
    return {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "t"}, "spec": body}


def errors_of(roles: dict, **spec: object) -> list[str]:
    with pytest.raises(SpecInvalid) as info:
        validate_manifest(manifest(roles, **spec))
    return [str(e) for e in info.value.errors]


def test_ref_and_critic_colocated_with_the_actor_are_accepted() -> None:
    gpus = {"replicas": 2, "gpus": 1}
    job = validate_manifest(manifest({"actor": gpus, "ref": {**gpus, "colocateWith": "actor"},
                                      "critic": {**gpus, "colocateWith": "actor"}}))
    assert job.spec.roles.ref.colocate_with == "actor" and job.spec.roles.critic.colocate_with == "actor"
    assert job.spec.roles.actor.colocate_with is None


def test_a_disabled_role_may_keep_its_colocate_with() -> None:
    """Only running roles are checked: a ref scaled to 0 colocated with the actor is no error."""
    job = validate_manifest(manifest({"ref": {"replicas": 0, "colocateWith": "actor"}}))
    assert job.spec.roles.ref.colocate_with == "actor"


def test_extra_role_colocated_with_the_actor() -> None:
    extra = {"judge": {"worker": "pkg.mod:Judge", "colocateWith": "actor"}}
    job = validate_manifest(manifest({"extra": extra}))
    assert job.spec.roles.extra["judge"].colocate_with == "actor"


@pytest.mark.parametrize(("roles", "spec", "field", "words"), [
    ({"ref": {"colocateWith": "ref"}}, {}, "roles.ref.colocateWith", "names ref itself"),
    ({"ref": {"colocateWith": "acter"}}, {}, "roles.ref.colocateWith", "'acter', which is not a role"),
    ({"ref": {"colocateWith": "critic"}}, {"algorithm": {"name": "grpo", "groupSize": 2}},
     "roles.ref.colocateWith", "does not run in this job"),
    ({"critic": {"colocateWith": "ref"}, "ref": {"replicas": 0}}, {}, "roles.critic.colocateWith",
     "does not run in this job"),
    ({"ref": {"colocateWith": "critic"}, "critic": {"colocateWith": "actor"}}, {}, "roles.ref.colocateWith",
     "a chain of colocations"),
    ({"ref": {"gpus": 1, "colocateWith": "actor"}}, {}, "roles.ref.colocateWith", "1 gpus but actor has 1 x 0"),
    ({"actor": {"replicas": 2}, "ref": {"colocateWith": "actor"}}, {}, "roles.ref.colocateWith",
     "ref has 1 replicas x 0 gpus but actor has 2 x 0"),
    ({"actor": {"gpus": 1}, "ref": {"gpus": 1, "gpuProduct": "NVIDIA-H200", "colocateWith": "actor"}}, {},
     "roles.ref.gpuProduct", "runs on actor's GPUs"),
    ({"ref": {"colocateWith": "actor"}}, {"resilience": {"standby": True}}, "resilience.standby", "(actor, ref)"),
    ({"ref": {"colocateWith": "actor"}, "actor": {"standby": True}}, {}, "roles.actor.standby", "(actor, ref)"),
    ({"ref": {"colocateWith": "actor", "tolerations": [{"key": "k", "operator": "Exists"}]}}, {},
     "roles.ref.tolerations", "runs in actor's pods"),
])
def test_colocation_errors_name_the_field(roles: dict, spec: dict, field: str, words: str) -> None:
    (err,) = errors_of(roles, **spec)
    assert "\n" not in err and err.startswith(f"spec.{field}:") and words in err and "fix" in err, err


def test_the_roles_that_share_gpus_can_leave_the_jobs_standby_out() -> None:
    """resilience.standby for the job, roles.<role>.standby: false for the two that share GPUs: valid, and only
    the others keep a standby."""
    roles = {"ref": {"colocateWith": "actor", "standby": False}, "actor": {"standby": False}}
    spec = validate_manifest(manifest(roles, resilience={"standby": True})).spec
    assert [spec.standby(r) for r in ("actor", "critic", "ref", "reward")] == [False, True, False, True]


def test_a_cycle_is_named_a_cycle_on_each_role() -> None:
    errs = errors_of({"ref": {"colocateWith": "critic"}, "critic": {"colocateWith": "ref"}})
    assert len(errs) == 2 and all("a cycle of colocations" in e for e in errs), errs
    assert {e.split(":")[0] for e in errs} == {"spec.roles.ref.colocateWith", "spec.roles.critic.colocateWith"}


def test_colocate_with_must_look_like_a_role_name() -> None:
    (err,) = errors_of({"ref": {"colocateWith": "Actor Role"}})
    assert err.startswith("spec.roles.ref.colocateWith: must match") and "\n" not in err, err


def test_asynchronous_rollout_refused_when_the_actor_shares_its_gpus() -> None:
    (err,) = errors_of({"ref": {"colocateWith": "actor"}}, rollout={"asynchronous": True})
    assert err.startswith("spec.rollout.asynchronous:") and "shares its GPUs with ref" in err, err


def test_colocation_sets_shares_and_bundles() -> None:
    from kuberl.spec.colocation import gpu_share, host_of, set_bundle, sharing

    gpus = {"replicas": 2, "gpus": 1}
    spec = validate_manifest(manifest({
        "actor": {**gpus, "resources": {"cpu": "2"}}, "ref": {**gpus, "colocateWith": "actor"},
        "critic": {**gpus, "colocateWith": "actor", "resources": {"cpu": "500m"}}})).spec
    assert sharing(spec, "ref") == sharing(spec, "actor") == ("actor", "critic", "ref")
    assert sharing(spec, "reward") == () and host_of(spec, "reward") == "reward" and host_of(spec, "ref") == "actor"
    assert gpu_share(spec, "critic") == pytest.approx(1 / 3) and gpu_share(spec, "reward") == 1.0
    assert set_bundle(spec, "actor") == {"CPU": 3.5, "GPU": 1.0, "kuberl_role_actor": 1.0,
                                         "kuberl_role_critic": 1.0, "kuberl_role_ref": 1.0}
    off = validate_manifest(manifest({"ref": {"replicas": 0, "colocateWith": "actor"}})).spec
    assert sharing(off, "actor") == () and host_of(off, "ref") == "ref"  # a role that does not run shares nothing

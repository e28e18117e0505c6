"""A training role's optim block (spec.roles.<role>.optim) and spec.trainer's deprecated fields it replaces: the
aliases fill it, a conflict is refused on one line naming both fields, `kuberl validate` notes the deprecation, and
the values reach the optimizer, and every example, which now sets the block, trains and hashes as it did with the
deprecated fields."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from kuberl.cli import main
from kuberl.resilience.identity import trained_fields
from kuberl.spec import JobSpec, SpecInvalid, deprecations, parse_yaml, validate_manifest

from .test_spec import manifest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").rglob("*.yaml"))


def spec(**sections) -> JobSpec:
    return validate_manifest(manifest(**sections)).spec


def optim(s: JobSpec, role: str) -> dict:
    return s.optim(role).model_dump()


def as_before_the_block(raw: dict) -> dict:
    """A parsed manifest with each training role's optim lr moved to its deprecated spec.trainer field, the way the
    examples gave it before the block."""
    old = copy.deepcopy(raw)
    roles, trainer = old["spec"].get("roles", {}), old["spec"].setdefault("trainer", {})
    for role, alias in (("actor", "actorLr"), ("critic", "criticLr")):
        block = roles.get(role, {}).get("optim", {})
        if "lr" in block:
            trainer[alias] = block.pop("lr")
    return old


def test_defaults_are_the_trainers_of_before() -> None:
    s = spec()
    for role in ("actor", "critic"):
        assert optim(s, role) == {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.0, "warmup_steps": 0}
    t = s.trainer
    assert (t.actor_lr, t.critic_lr, t.weight_decay, t.warmup_steps) == (1e-3, 1e-3, 0.0, 0)


def test_deprecated_fields_fill_the_blocks() -> None:
    s = spec(trainer={"actorLr": 0.003, "criticLr": 0.01, "weightDecay": 0.1, "warmupSteps": 5})
    assert optim(s, "actor") == {"lr": 0.003, "betas": [0.9, 0.95], "weight_decay": 0.1, "warmup_steps": 5}
    assert optim(s, "critic") == {"lr": 0.01, "betas": [0.9, 0.95], "weight_decay": 0.1, "warmup_steps": 5}


def test_the_blocks_read_back_through_the_deprecated_fields() -> None:
    s = spec(roles={"actor": {"optim": {"lr": 0.02, "weightDecay": 0.1}}, "critic": {"optim": {"weightDecay": 0.2}}})
    assert (s.trainer.actor_lr, s.trainer.critic_lr) == (0.02, 1e-3)
    assert s.trainer.weight_decay is None  # the roles differ
    assert s.trainer.warmup_steps == 0


@pytest.mark.parametrize("sections", [
    {"roles": {"actor": {"optim": {"lr": 0.02, "weightDecay": 0.1, "betas": [0.8, 0.9]}},
               "critic": {"optim": {"weightDecay": 0.2, "warmupSteps": 3}}}},
    {"trainer": {"actorLr": 0.003, "weightDecay": 0.1}, "roles": {"critic": {"optim": {"lr": 0.5}}}},
])
def test_a_dumped_spec_reads_back_the_same(sections) -> None:
    """A worker validates the driver's dump again: the values written back into the aliases raise no conflict."""
    s = spec(**sections)
    again = JobSpec.model_validate_json(s.model_dump_json(by_alias=True))
    assert again.model_dump() == s.model_dump()


@pytest.mark.parametrize("trainer, roles, field, alias", [
    ({"actorLr": 0.003}, {"actor": {"optim": {"lr": 0.01}}}, "spec.roles.actor.optim.lr", "spec.trainer.actorLr"),
    ({"criticLr": 0.003}, {"critic": {"optim": {"lr": 0.01}}}, "spec.roles.critic.optim.lr", "spec.trainer.criticLr"),
    ({"weightDecay": 0.1}, {"critic": {"optim": {"weightDecay": 0.2}}}, "spec.roles.critic.optim.weightDecay",
     "spec.trainer.weightDecay"),
    ({"warmupSteps": 2}, {"actor": {"optim": {"warmupSteps": 4}}}, "spec.roles.actor.optim.warmupSteps",
     "spec.trainer.warmupSteps"),
])
def test_both_set_to_different_values_is_refused_naming_both(trainer, roles, field, alias) -> None:
    with pytest.raises(SpecInvalid) as info:
        validate_manifest(manifest(trainer=trainer, roles=roles))
    (line,) = [str(e) for e in info.value.errors]
    assert line.startswith(f"{field}: is ") and alias in line and "(fix: remove " + alias in line
    assert "\n" not in line


def test_both_set_to_the_same_value_is_accepted() -> None:
    s = spec(trainer={"actorLr": 0.01, "weightDecay": 0.1},
             roles={"actor": {"optim": {"lr": 0.01, "weightDecay": 0.1}}})
    assert optim(s, "actor")["lr"] == 0.01 and optim(s, "critic")["weight_decay"] == 0.1


@pytest.mark.parametrize("role", ["ref", "reward"])
def test_roles_that_do_not_train_have_no_optim(role) -> None:
    with pytest.raises(SpecInvalid) as info:
        validate_manifest(manifest(roles={role: {"optim": {"lr": 0.1}}}))
    assert str(info.value.errors[0]).startswith(f"spec.roles.{role}.optim: is not a known field")


def test_betas_are_two_numbers_in_0_1() -> None:
    for bad in ([0.9], [0.9, 1.0], [0.9, 0.95, 0.99], [-0.1, 0.9]):
        with pytest.raises(SpecInvalid) as info:
            validate_manifest(manifest(roles={"actor": {"optim": {"betas": bad}}}))
        assert all(str(e).startswith("spec.roles.actor.optim.betas") for e in info.value.errors), bad


def test_validate_notes_each_deprecated_field_with_its_replacement(tmp_path, capsys) -> None:
    old = tmp_path / "old.yaml"
    quickstart = REPO / "examples" / "quickstart.yaml"
    old.write_text(yaml.safe_dump(as_before_the_block(parse_yaml(quickstart.read_text(), str(quickstart)))))
    assert main(["validate", str(old), "--spec-only", "--set", "trainer.weightDecay=0.1"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert f"{old}: note: spec.trainer.actorLr is deprecated (accepted for one more version): write " \
           f"spec.roles.actor.optim.lr instead" in err
    assert any("spec.trainer.weightDecay" in line and "spec.roles.actor.optim.weightDecay and "
               "spec.roles.critic.optim.weightDecay" in line for line in err)
    new = manifest(roles={"actor": {"optim": {"lr": 0.01}}})
    assert deprecations(new) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_trains_and_hashes_as_with_the_deprecated_fields(path) -> None:
    """The examples gave their learning rates as spec.trainer.actorLr and criticLr before the block: written that way
    again, each trains with the same optimizers and hashes alike (a checkpoint of the old example resumes)."""
    raw = parse_yaml(path.read_text(), str(path))
    new, old = validate_manifest(raw).spec, validate_manifest(as_before_the_block(raw)).spec
    assert deprecations(raw) == []
    for role in ("actor", "critic"):
        assert optim(new, role) == optim(old, role)
    assert trained_fields(new) == trained_fields(old)


def test_an_alias_and_its_field_hash_alike_and_betas_count() -> None:
    """The job identity records the optimizer as before the block, so old checkpoints still resume."""
    by_alias = trained_fields(spec(trainer={"actorLr": 0.5, "weightDecay": 0.1}))
    by_block = trained_fields(spec(roles={"actor": {"optim": {"lr": 0.5, "weightDecay": 0.1}},
                                          "critic": {"optim": {"weightDecay": 0.1}}}))
    assert by_alias == by_block and by_alias["spec.trainer.actorLr"] == 0.5
    assert not any(".optim." in key for key in by_alias)
    betas = trained_fields(spec(roles={"critic": {"optim": {"betas": [0.9, 0.99]}}}))
    assert betas["spec.roles.critic.optim.betas"] == [0.9, 0.99]


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_the_block_reaches_the_optimizer(role, one_rank_group) -> None:
    from kuberl.training.kernels import KernelOptions
    from kuberl.training.trainer import FSDPTrainer

    from .test_lora import small_lm

    s = spec(trainer={"gradClip": 0.5},
             roles={role: {"optim": {"lr": 0.02, "betas": [0.8, 0.9], "weightDecay": 0.1, "warmupSteps": 3}}})
    worker = SimpleNamespace(spec=s, role=role, device=torch.device("cpu"), dtype=torch.float32,
                             kernels=KernelOptions())
    trainer = FSDPTrainer.for_role(worker, small_lm())
    (group,) = trainer.optimizer.optimizer.param_groups
    assert (group["betas"], group["weight_decay"], trainer.grad_clip) == ((0.8, 0.9), 0.1, 0.5)
    assert [trainer.set_step(step) for step in (0, 3)] == [pytest.approx(0.02 / 4), 0.02]

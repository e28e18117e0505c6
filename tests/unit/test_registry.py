"""Registries: built-ins by name, user code by import path, one-line field-named errors; the new estimators."""

from __future__ import annotations

import math

import pytest
import torch

from kuberl import algos
from kuberl.registry import Registry, RegistryError
from kuberl.spec.model import ADVANTAGE_ESTIMATOR_NAMES, KL_ESTIMATOR_NAMES, POLICY_LOSS_NAMES, AlgorithmSpec


def close(got, want, **kw):
    torch.testing.assert_close(got, torch.as_tensor(want, dtype=got.dtype), **kw)


def test_every_built_in_name_of_the_spec_has_an_implementation():
    for registry, names in ((algos.ADVANTAGE_ESTIMATORS, ADVANTAGE_ESTIMATOR_NAMES),
                            (algos.POLICY_LOSSES, POLICY_LOSS_NAMES), (algos.KL_ESTIMATORS, KL_ESTIMATOR_NAMES)):
        assert all(callable(registry.get(n)) for n in names)


def test_a_user_function_by_import_path_is_the_same_path_as_a_built_in():
    assert algos.ADVANTAGE_ESTIMATORS.get("kuberl.algos.advantages:rloo") is algos.ADVANTAGE_ESTIMATORS.get("rloo")


@pytest.mark.parametrize("key, words", [("no_such_pkg.adv:estimate", "cannot import module 'no_such_pkg.adv'"),
                                        ("kuberl.algos.advantages:nope", "has no attribute 'nope'"),
                                        ("bogus", "unknown advantage estimator 'bogus'; allowed: gae, grpo")])
def test_unresolvable_entries_are_one_line_naming_the_field(key, words):
    with pytest.raises(RegistryError) as info:
        algos.ADVANTAGE_ESTIMATORS.get(key)
    msg = str(info.value)
    assert msg.startswith("spec.algorithm.advantageEstimator: ") and words in msg and "(fix: " in msg
    assert "\n" not in msg


def test_registering_a_name_the_spec_does_not_know_is_refused():
    reg: Registry = Registry("thing", "spec.x", ("a",))
    with pytest.raises(ValueError, match="not a built-in thing"):
        reg.register("b")


def test_rloo_leaves_each_sample_out_of_its_baseline():
    scores = torch.tensor([1.0, 0.0, 2.0, 4.0, 3.0, 9.0])
    group = torch.tensor([3, 7, 3, 7, 3, 5])
    # group 3 = [1, 2, 3]: 1 - (2+3)/2 = -1.5, 2 - (1+3)/2 = 0, 3 - (1+2)/2 = 1.5
    # group 7 = [0, 4]: 0 - 4 = -4, 4 - 0 = 4; group 5 = [9]: alone -> 0
    close(algos.rloo_advantages(scores, group), [-1.5, -4.0, 0.0, 4.0, 1.5, 0.0])


def test_reinforce_pp_whitens_returns_to_go_over_the_batch():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, -1.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # returns-to-go (gamma 1): row 0 [1, 1, 1]; row 1 [0.5 - 1, -1, masked] = [-0.5, -1, 0]
    # valid: [1, 1, 1, -0.5, -1], mean 0.3, unbiased var (3 x 0.49 + 0.64 + 1.69) / 4 = 0.95
    s = math.sqrt(0.95)
    close(algos.reinforce_pp_advantages(rewards, mask), [[0.7 / s] * 3, [-0.8 / s, -1.3 / s, 0.0]], atol=1e-6, rtol=0)
    # gamma 0.5 on one row: [0.25, 0.5, 1], mean 7/12, unbiased var 0.291667 / 2 = 0.145833
    one = algos.reinforce_pp_advantages(torch.tensor([[0.0, 0.0, 1.0]]), torch.ones(1, 3), gamma=0.5)
    close(one, [[-0.872872, -0.218218, 1.091089]], atol=1e-5, rtol=0)


def test_estimators_through_the_registry():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    rewards = algos.token_rewards(torch.tensor([2.0, 0.0]), mask)
    x = algos.AdvantageInputs(token_rewards=rewards, mask=mask, group_index=torch.tensor([0, 0]))
    adv, returns = algos.ADVANTAGE_ESTIMATORS.get("rloo")(x)
    close(adv, [[2.0, 2.0, 0.0], [-2.0, 0.0, 0.0]])  # 2 - 0 and 0 - 2 on each valid token
    assert returns is None
    with pytest.raises(ValueError, match="needs critic values"):
        algos.ADVANTAGE_ESTIMATORS.get("gae")(x)


def test_reinforce_policy_loss_is_minus_advantage_on_policy():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -2.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = algos.POLICY_LOSSES.get("reinforce")(logp, logp.detach(), adv, mask, AlgorithmSpec())
    assert float(loss.detach()) == pytest.approx(0.5)  # -(1 - 2) / 2 valid tokens
    loss.backward()
    close(logp.grad, [[-0.5, 1.0, 0.0]])  # -A / n on the valid tokens
    assert float(metrics["clip_frac"]) == 0.0 and float(metrics["ratio_mean"]) == 1.0
    clip, _ = algos.POLICY_LOSSES.get("clip")(logp.detach(), logp.detach(), adv, mask, AlgorithmSpec())
    assert float(clip) == pytest.approx(0.5)  # at ratio 1 the clipped surrogate is the same


def test_built_in_models_and_tasks_have_one_list_of_names_the_spec():
    from kuberl.data.tasks import BUILTIN_TASKS as TASK_BUILDERS
    from kuberl.spec.model import BUILTIN_MODELS, BUILTIN_TASKS, ROLES, RolesSpec
    from kuberl.training.models import BUILTIN_SHAPES

    assert tuple(BUILTIN_SHAPES) == BUILTIN_MODELS and tuple(TASK_BUILDERS) == BUILTIN_TASKS
    assert tuple(f for f in RolesSpec.model_fields if f != "extra") == ROLES

"""spec.resilience.snapshots: which trainable roles keep per-step snapshots."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kuberl.library import Roles
from kuberl.spec import validate_manifest


def spec(snapshots: str | None, roles: dict):
    resilience = {} if snapshots is None else {"snapshots": snapshots}
    return validate_manifest({
        "apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "t"},
        "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
                 "roles": roles, "resilience": resilience}}).spec


APART = {"actor": {"gpus": 1}}  # a GPU actor, a CPU critic
SHARED = {"actor": {"gpus": 1}, "critic": {"gpus": 1, "colocateWith": "actor"}}


@pytest.mark.parametrize("mode, roles, actor_on, critic_on", [
    (None, APART, True, True),     # auto (the default): on, on a GPU too
    ("auto", APART, True, True),
    ("auto", SHARED, False, False),  # roles sharing GPUs: the copy would be waited for before each sleep
    ("on", SHARED, True, True),
    ("off", APART, False, False),
])
def test_snapshots_follow_the_mode_and_whether_the_role_shares_its_gpus(mode, roles, actor_on, critic_on) -> None:
    ns = SimpleNamespace(spec=spec(mode, roles))
    assert (Roles._snapshots_on(ns, "actor"), Roles._snapshots_on(ns, "critic")) == (actor_on, critic_on)

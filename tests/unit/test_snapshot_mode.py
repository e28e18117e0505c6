"""spec.resilience.snapshots: which trainable roles keep per-step snapshots."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kuberl.library import Roles
from kuberl.spec import validate_manifest


def spec(snapshots: str | None, actor_gpus: int):
    resilience = {} if snapshots is None else {"snapshots": snapshots}
    return validate_manifest({
        "apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "t"},
        "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
                 "roles": {"actor": {"gpus": actor_gpus}},
                 "resilience": resilience}}).spec


@pytest.mark.parametrize("mode, actor_on, critic_on", [
    (None, False, True),     # auto (the default): the GPU actor takes none, the CPU critic does
    ("auto", False, True),
    ("on", True, True),
    ("off", False, False),
])
def test_snapshots_follow_the_mode_and_the_roles_devices(mode, actor_on, critic_on) -> None:
    roles = SimpleNamespace(spec=spec(mode, actor_gpus=1))
    assert (Roles._snapshots_on(roles, "actor"), Roles._snapshots_on(roles, "critic")) == (actor_on, critic_on)

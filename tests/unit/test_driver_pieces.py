"""The driver's small pieces: the one-step-off rollout (`kuberl.controller.driver.RolloutAhead`) and the resize arbiter
(`kuberl.resilience.resize.ResizeArbiter`), without any role running."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from kuberl.controller.driver import RolloutAhead
from kuberl.resilience.resize import ResizeArbiter, write_request
from kuberl.spec import validate_manifest
from kuberl.spec.contract import ReplicasDocument


def rollout(step: int) -> SimpleNamespace:
    return SimpleNamespace(phase=f"call {step}", data_before={"position": step})


def test_a_rollout_is_sent_ahead_only_when_on_and_the_run_has_that_step() -> None:
    sent: list[int] = []

    def send(step: int) -> SimpleNamespace:
        sent.append(step)
        return rollout(step)

    off = RolloutAhead(enabled=False)
    assert off.send(2, 5, send) is None and sent == [] and off.take() is None
    ahead = RolloutAhead(enabled=True)
    assert ahead.data_before(lambda: {"position": 0}) == {"position": 0}
    assert ahead.send(6, 5, send) is None and sent == []  # past the run's last step
    assert ahead.send(5, 5, send) == "call 5" and sent == [5]
    assert ahead.data_before(lambda: {"position": 0}) == {"position": 5}  # a resume draws its prompts again
    assert ahead.take().phase == "call 5" and ahead.take() is None


def spec():
    body = {"data": {"task": "repeat-letter"}, "reward": {"function": "kuberl.rewards.builtin:repeat_letter"}}
    return validate_manifest({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "t"},
                              "spec": body}).spec


def test_the_arbiter_lets_a_good_request_through_and_says_a_standing_refusal_once(tmp_path: Path, capsys) -> None:
    arbiter, now = ResizeArbiter("job", tmp_path), spec()
    write_request(tmp_path, "ref", 2)
    write_request(tmp_path, "critic", now.roles.critic.replicas)  # what runs: no change
    operator = ReplicasDocument(roles={"reward": 2, "ref": 3})
    assert arbiter.requests(now, lambda: operator) == {"ref": 2, "reward": 2}  # the local request wins
    assert arbiter.requests(now, None) == {}  # taken as they were read
    running = ("actor", "critic", "ref", "reward")
    grown = arbiter.approve(now, "ref", 2, running, on_kubernetes=False)
    assert grown.roles.ref.replicas == 2 and now.roles.ref.replicas == 1
    for _ in range(2):
        assert arbiter.approve(now, "judge", 2, running, on_kubernetes=False) is None
        assert arbiter.approve(now, "reward", 3, running, on_kubernetes=False) is None  # does not split a step
    out = capsys.readouterr().out
    assert out.count("[job] scale refused: role judge cannot be resized live") == 1
    assert out.count("[job] scale refused: spec.roles.reward.replicas") == 1
    assert arbiter.approve(now, "critic", 2, running, on_kubernetes=True) is None  # no shared checkpoint volume
    assert "needs spec.trainer.checkpoint.volumeClaim" in capsys.readouterr().out
    assert arbiter.approve(now, "reward", 2, running, on_kubernetes=False).roles.reward.replicas == 2
    assert arbiter.approve(now, "reward", 3, running, on_kubernetes=False) is None  # refused again after a change
    assert "scale refused: spec.roles.reward.replicas" in capsys.readouterr().out

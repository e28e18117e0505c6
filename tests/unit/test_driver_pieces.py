"""The driver's small pieces, without any role running: the one-step-off rollout (`kuberl.driver.RolloutAhead`)."""

from __future__ import annotations

from types import SimpleNamespace

from kuberl.driver import RolloutAhead


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

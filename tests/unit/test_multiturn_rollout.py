"""Multi-turn rollout (kuberl.rollout.multiturn) on the real hf engine and the tiny model: the environment reads the
policy's own turns, the observations sit in the trajectory as context and out of the loss, the log-probs recorded at
generation are the trainer's on the assembled batch, and an environment that raises, hangs or answers nonsense
fails its trajectory alone."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from kuberl.envs import EnvStep
from kuberl.rollout.hf import HFRollout
from kuberl.rollout.multiturn import MultiTurnRollout, batch_env_spans, busy_spans, episode_stats, turn_spec
from kuberl.spec import JobSpec
from kuberl.training.models import char_tokenizer, load_causal_lm
from kuberl.training.sequence import response_logprobs

SLOW_S = 1.5  # the "slow" environment's first step
RELEASE = threading.Event()  # lets a hanging environment's thread end once its test is over


class Recorder:
    """Asks for a letter, then for the next one; remembers every action text it was given (per instance)."""

    def reset(self, row: dict[str, Any]) -> str:
        self.letter, self.actions = row["answer"], []
        mode = row.get("mode", "ok")
        if mode == "reset-raises":
            raise RuntimeError("no such level\nsecond line")
        self.mode = mode
        return row["prompt"]

    def step(self, action_text: str) -> Any:
        self.actions.append(action_text)
        STEPS.append((self, action_text))
        if self.mode == "raises":
            raise ValueError("tool crashed")
        if self.mode == "hangs":
            RELEASE.wait(30)
        if self.mode == "slow" and len(self.actions) == 1:
            time.sleep(SLOW_S)
            self.answered_at = time.monotonic()
        if self.mode == "nonsense":
            return 42
        done = len(self.actions) >= 2
        info = {"tool_calls": 1, "tool_errors": int(done)}  # as the tool environment counts them, per step
        return EnvStep("" if done else f" say {chr(ord(self.letter) + 1)}:", float(len(self.actions)), done, info)


STEPS: list[tuple[Recorder, str]] = []


def job(**env: Any) -> JobSpec:
    return JobSpec.model_validate({
        "model": {"builtin": "tiny"}, "data": {"task": "repeat-letter", "maxPromptLength": 8},
        "reward": {"function": "environment"}, "rollout": {"maxNewTokens": 24, "temperature": 1.0},
        "environment": {"module": "my_env", "class": "Recorder", "maxTurns": 2, "maxTokensPerTurn": 8,
                        "timeoutSeconds": 2, "concurrency": 4, **env}})


@pytest.fixture
def rollout() -> MultiTurnRollout:
    spec, tok = job(), char_tokenizer()
    engine = HFRollout(turn_spec(spec), torch.device("cpu"), torch.float32, tok, fast=False)
    STEPS.clear()
    return MultiTurnRollout(spec, engine, tok, Recorder)


def rows(*modes: str) -> list[dict[str, Any]]:
    return [{"prompt": f"say {c}:", "answer": c, "mode": m} for c, m in zip("abcdef", modes)]


def test_two_turns_with_the_observation_in_context_and_out_of_the_loss(rollout: MultiTurnRollout) -> None:
    out = rollout.run(rows("ok", "ok", "ok"), seed=3)
    tok, width = char_tokenizer(), 24
    assert out["responses"].shape == (3, width) and out["input_ids"].shape == (3, 8 + width)
    assert out.meta["env_turns"] == [2, 2, 2] and out.meta["env_failure"] == [None] * 3
    for row in range(3):
        mask, resp = out["response_mask"][row].bool(), out["responses"][row]
        env = next(e for e, _ in STEPS if e.letter == "abc"[row])
        # the environment was given the policy's turns, decoded; they are the trained tokens, in order
        policy = resp[mask].tolist()
        assert "".join(env.actions) == tok.decode(policy, skip_special_tokens=True)
        # between them, the observation, as context: attended, not trained on, no log-prob
        first = out.meta["turn_ends"][row][0] + 1
        obs = tok(f" say {chr(ord('abc'[row]) + 1)}:", add_special_tokens=False)["input_ids"]
        assert resp[first:first + len(obs)].tolist() == obs and not mask[first:first + len(obs)].any()
        assert out["attention_mask"][row, 8:].sum() == mask.sum() + len(obs)
        assert (out["rollout_logprobs"][row][~mask] == 0).all() and (out["rollout_logprobs"][row][mask] < 0).all()
        # each turn's reward (1, then 2) on its last token
        ends = out.meta["turn_ends"][row]
        assert out["env_rewards"][row].nonzero().flatten().tolist() == list(ends)
        assert out["env_rewards"][row, list(ends)].tolist() == [1.0, 2.0]
    # when the environments ran, for the timeline: resets, then steps, once per rank (its first row)
    spans = batch_env_spans(out)
    assert spans[0][0] == "env_reset" and {name for name, *_ in spans[1:]} == {"env_step"}
    assert out.meta["env_spans"][1:] == [[], []] and all(0 <= start < end for _, start, end in spans)
    assert spans[0][2] <= spans[1][1] and len(spans) <= 3  # the resets, then each turn's steps (merged, or one span)
    stats = episode_stats(out)
    assert stats.pop("env_seconds") > 0
    assert stats == {"env_failed": 0.0, "env_turns_mean": 2.0, "env_reward_mean": 3.0, "env_truncated": 0.0,
                     "env_tool_calls": 6.0, "env_tool_errors": 3.0}


def test_the_generation_log_probs_are_the_trainers_on_the_assembled_trajectory(rollout: MultiTurnRollout) -> None:
    # the second turn was drawn after the observation: the model reading the whole trajectory gives its log-probs
    out = rollout.run(rows("ok", "ok"), seed=5)
    model = load_causal_lm(job().model, seed=job().trainer.seed)
    model.load_state_dict(rollout.engine.model.state_dict())
    logp, _ = response_logprobs(model, out["input_ids"], out["attention_mask"], out["responses"], 1.0)
    mask = out["response_mask"].bool()
    torch.testing.assert_close(logp[mask], out["rollout_logprobs"][mask], atol=1e-4, rtol=0)


def test_an_environment_that_fails_fails_its_trajectory_alone(rollout: MultiTurnRollout) -> None:
    try:
        out = rollout.run(rows("ok", "raises", "hangs", "nonsense", "reset-raises", "ok"), seed=7)
    finally:
        RELEASE.set()
    failures = out.meta["env_failure"]
    assert failures[0] is None and failures[5] is None
    assert failures[1] == "my_env.Recorder.step() raised ValueError: tool crashed"
    assert failures[2] == "my_env.Recorder.step() took longer than timeoutSeconds (2.0 s)"
    assert failures[3].startswith("spec.environment.class my_env.Recorder: step() returned an int")
    assert failures[4] == "my_env.Recorder.reset() raised RuntimeError: no such level"
    for row in (1, 2, 3, 4):  # nothing of a failed trajectory is trained on or rewarded
        assert out["response_mask"][row].sum() == 0 and out["env_rewards"][row].sum() == 0
        assert out["attention_mask"][row].sum() >= 1  # a row keeps a token: packing needs one
    assert out.meta["env_turns"][0] == 2 and out["env_rewards"][0].sum() == 3.0
    stats = episode_stats(out)
    # the rollout waited for the hanging call (2 s) only where no other trajectory had a turn to generate
    assert stats["env_failed"] == 4.0 and 0.0 < stats["env_seconds"] <= 2.5


def test_a_slow_environment_holds_up_its_own_trajectory_not_the_others_turns(rollout: MultiTurnRollout) -> None:
    calls: list[tuple[float, int]] = []  # each generate: when it started, and how many trajectories it took
    generate = rollout.engine.generate

    def recorded(ids, mask, seed):
        calls.append((time.monotonic(), ids.shape[0]))
        return generate(ids, mask, seed=seed)

    rollout.engine.generate = recorded
    out = rollout.run(rows("slow", "ok", "ok"), seed=5)
    slow = next(e for e, _ in STEPS if e.mode == "slow")
    assert out.meta["env_failure"] == [None] * 3 and out.meta["env_turns"] == [2, 2, 2]
    # the fast trajectories' second turns were generated while the slow environment was still thinking, the slow
    # one's second turn in a generate of its own after it answered
    assert calls[0][1] == 3 and calls[1][1] == 2 and calls[1][0] < slow.answered_at
    assert calls[2][1] == 1 and calls[2][0] >= slow.answered_at and len(calls) == 3


def test_busy_spans_merge_overlapping_calls_of_a_kind() -> None:
    calls = [("step", 12.0, 13.0), ("reset", 10.0, 10.5), ("step", 12.5, 14.0), ("reset", 10.2, 10.4),
             ("step", 15.0, 15.5)]
    assert busy_spans(calls, t0=10.0) == [("env_step", 2.0, 4.0), ("env_step", 5.0, 5.5), ("env_reset", 0.0, 0.5)]
    assert busy_spans(calls, t0=10.0, gap_s=1.0) == [("env_step", 2.0, 5.5), ("env_reset", 0.0, 0.5)]
    assert busy_spans([], t0=0.0) == []

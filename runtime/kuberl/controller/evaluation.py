"""Held-out evaluation (`spec.data.eval`): greedy answers to the eval prompts, scored by the job's reward.

Every `eval.interval` steps and at the last step, inside the step after the weight sync: the actor
answers each eval prompt through its rollout engine's greedy decoding (`RolloutEngine.greedy_answers`,
the policy's current weights; `ActorWorker.evaluate`), the reward role scores the answers as it scores
rollouts, and the step's record gains `eval_reward_mean` (and `eval_response_length_mean`, `time_eval_s`).
This module is the driver's side: the eval batch and its scores.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from kuberl.data.tasks import META_KEYS, load_eval_rows, prompt_batch
from kuberl.spec import JobSpec
from kuberl.training.sequence import SEQ_KEYS

if TYPE_CHECKING:
    from kuberl.controller.proxies import ActorProxy, RewardProxy


class Evaluator:
    """Owns the eval rows; `run(actor, reward)` evaluates through the roles' (restart-aware) proxies."""

    def __init__(self, spec: JobSpec, tokenizer: Any, rows: list[dict[str, Any]], ranks: int):
        self.spec, self.tokenizer, self.rows = spec, tokenizer, rows
        # every role splits a batch evenly over its ranks: pad the prompts to a multiple of all of them
        self.padded = rows + rows[: (-len(rows)) % ranks] if rows else rows

    @classmethod
    def for_spec(cls, spec: JobSpec, tokenizer: Any, ranks: int) -> Evaluator | None:
        """None when the spec has no eval section. `ranks`: a common multiple of the roles' world sizes."""
        if spec.data.eval is None:
            return None
        return cls(spec, tokenizer, load_eval_rows(spec.data), ranks)

    def due(self, step: int) -> bool:
        """Whether step `step` (1-based, the one being trained) ends with an evaluation."""
        return step % self.spec.data.eval.interval == 0 or step == self.spec.trainer.steps

    def run(self, actor: ActorProxy, reward: RewardProxy) -> dict[str, float]:
        batch = prompt_batch(self.padded, self.tokenizer, 1, self.spec.data.max_prompt_length)
        batch.update(actor.evaluate(batch.select("prompt_ids", "prompt_mask")))
        scores = reward.compute_scores(batch.select(*SEQ_KEYS, *META_KEYS))["scores"]
        n = len(self.rows)
        return {
            "eval_reward_mean": float(scores[:n].mean()),
            "eval_response_length_mean": float(batch["response_mask"][:n].sum()) / n,
        }


def common_ranks(sizes: list[int]) -> int:
    """The least common multiple of the roles' world sizes."""
    out = 1
    for size in sizes:
        out = out * size // math.gcd(out, size)
    return out

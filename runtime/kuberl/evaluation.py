"""Held-out evaluation (`spec.data.eval`): greedy answers to the eval prompts, scored by the job's reward.

Every `eval.interval` steps and at the last step, inside the step after the weight sync: the actor
decodes each eval prompt greedily with its rollout engine's model (the policy's current weights), the
reward role scores the answers as it scores rollouts, and the step's record gains
`eval_reward_mean` (and `eval_response_length_mean`, `time_eval_s`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .batch import Batch
from .spec import JobSpec
from .tasks import META_KEYS, load_eval_rows, prompt_batch

if TYPE_CHECKING:
    from .proxies import ActorProxy, RewardProxy

SEQ_KEYS = ("input_ids", "attention_mask", "responses", "response_mask")


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


def greedy_responses(model: Any, tokenizer: Any, prompt_ids, prompt_mask, max_new_tokens: int):
    """Greedy decoding with a Hugging Face causal LM: prompts [B, P] (left-padded) -> responses [B, R]
    (right-padded with pad, R = max_new_tokens)."""
    import torch

    device = next(model.parameters()).device
    out = model.generate(
        input_ids=prompt_ids.to(device),
        attention_mask=prompt_mask.to(device),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    resp = out[:, prompt_ids.shape[1] :]
    if resp.shape[1] < max_new_tokens:
        pad = resp.new_full((resp.shape[0], max_new_tokens - resp.shape[1]), tokenizer.pad_token_id)
        resp = torch.cat([resp, pad], dim=1)
    return resp


def eval_batch(model: Any, tokenizer: Any, batch: Batch, max_new_tokens: int) -> Batch:
    """The actor's side: greedy responses and the masks the reward role needs (CPU tensors)."""
    import torch

    from .sequence import response_mask

    prompts, pmask = batch["prompt_ids"], batch["prompt_mask"]
    responses = greedy_responses(model, tokenizer, prompts, pmask, max_new_tokens).cpu()
    rmask = response_mask(responses, tokenizer.eos_token_id, tokenizer.pad_token_id)
    return Batch(
        {
            "responses": responses,
            "response_mask": rmask,
            "input_ids": torch.cat([prompts.cpu(), responses], 1),
            "attention_mask": torch.cat([pmask.cpu().float(), rmask], 1).long(),
        }
    )

"""Rollout engines behind one interface: `hf` (transformers generate, or the static-cache fast path) and `vllm`.

`RolloutEngine` names everything the actor (`workers/actor.py`) uses of an engine; the actor reaches for
nothing else. `response_batch` turns an engine's responses into the sequence tensors the other roles read.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

import torch

from kuberl.data.batch import Batch
from kuberl.spec import JobSpec
from kuberl.training.sequence import response_mask


class RolloutEngine(Protocol):
    """Generates responses with the actor's current weights. Sleep and wake are the engine's own business
    (vllm: asleep after each `generate` under spec.rollout.sleepMode, woken by the next `load_weights`)."""

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Replace the engine's weights with the actor's (full, unsharded names as in HF)."""

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, seed: int,
                 greedy: bool = False) -> torch.Tensor:
        """Prompts [B, P] (left-padded) -> responses [B, R] (right-padded with pad, R = maxNewTokens);
        sampled, or with `greedy` the most likely token at each step."""

    def turns(self) -> AbstractContextManager[None]:
        """The `generate` calls inside are the turns of one multi-turn rollout (`kuberl.rollout.multiturn`): the
        engine stays awake between them, its cached prefixes with it, and sleeps after the last as after one."""

    def rollout_logprobs(self) -> torch.Tensor | None:
        """[B, R] float32 (on the engine's device or the CPU): the last `generate`'s log-prob of each drawn token
        as the engine drew it (0 past a response's end), the engine's side of the engine/trainer mismatch; None
        where it has none."""

    def greedy_answers(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Held-out evaluation: prompts [B, P] (left-padded) -> responses [B, R] (right-padded with pad), the
        most likely token at each step up to EOS, whatever spec.rollout.fixedLength says. Runs after a weight
        sync and before the next `generate`, so it leaves the engine awake."""

    def behaviour_model(self) -> torch.nn.Module:
        """The causal LM that generates the rollouts, for their behaviour log-probs under
        spec.rollout.asynchronous (the trained model is being updated meanwhile)."""

    def resident_modules(self) -> list[torch.nn.Module]:
        """The engine's modules the actor keeps on its device between phases (offloaded while it shares its
        GPUs, `kuberl.training.idle`); none that captured CUDA graphs point into."""


def make_engine(spec: JobSpec, device: torch.device, dtype: torch.dtype, tokenizer) -> RolloutEngine:
    if spec.rollout.engine == "vllm":
        from .vllm import VLLMRollout

        return VLLMRollout(spec, tokenizer, device)
    from .hf import HFRollout

    return HFRollout(spec, device, dtype, tokenizer)


def response_batch(prompts: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor,
                   eos_id: int | None) -> Batch:
    """Prompts [B, P] (left-padded) and responses [B, R] -> a Batch of responses and response_mask [B, R] (1 up
    to and including the first EOS; with `eos_id` None, fixed-length responses, every token), input_ids and
    attention_mask [B, P + R]. All on the inputs' device."""
    rmask = response_mask(responses, eos_id)
    return Batch({"responses": responses, "response_mask": rmask,
                  "input_ids": torch.cat([prompts, responses], dim=1),
                  "attention_mask": torch.cat([prompt_mask.float(), rmask], dim=1).long()})

"""Rollout engines behind one interface: `hf` (transformers generate, or the static-cache fast path) and `vllm`."""

from __future__ import annotations

from typing import Protocol

import torch

from ..spec import JobSpec


class RolloutEngine(Protocol):
    """Generates responses with the actor's current weights."""

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Replace the engine's weights with the actor's (full, unsharded names as in HF)."""

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, seed: int,
                 greedy: bool = False) -> torch.Tensor:
        """Prompts [B, P] (left-padded) -> responses [B, R] (right-padded with pad, R = maxNewTokens);
        sampled, or with `greedy` the most likely token at each step."""


def make_engine(spec: JobSpec, device: torch.device, dtype: torch.dtype, tokenizer) -> RolloutEngine:
    if spec.rollout.engine == "vllm":
        from .vllm import VLLMRollout

        return VLLMRollout(spec, tokenizer, device)
    from .hf import HFRollout

    return HFRollout(spec, device, dtype, tokenizer)

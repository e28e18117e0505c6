"""A multi-turn trajectory as the tensors the trainer reads: pure tensor assembly, no model, no environment.

A trajectory is the prompt, then turns: the policy's tokens (with the log-probs the rollout engine drew them
with) and the environment's observation tokens between them. After the prompt they are laid end to end, with no
hole, in one response of width R (spec.rollout.maxNewTokens), right-padded with the pad id:

    responses           [R]    policy and observation tokens, then pad
    response_mask       [R]    1 on the policy's tokens only: the loss mask (observations are not trained on)
    attention_mask      [P+R]  1 on every real token, the observations' included: the models read them as context
    rollout_logprobs    [R]    the engine's log-prob of each policy token, 0 on observation tokens and padding

This is the layout of `kuberl.rollout.response_batch` (kuberl.training.sequence) with holes in the response
mask: a forward pass predicts every response token from the one before it, observations included, and the losses
and the packed path (`kuberl.training.packing`) only take the positions where response_mask is 1. A policy turn
ends at its first EOS (kept, as response_mask keeps it) or after maxTokensPerTurn tokens; a trajectory longer than
R is cut at R and marked truncated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kuberl.data.batch import Batch

Tokens = Sequence[int] | torch.Tensor


@dataclass(frozen=True)
class Turn:
    """One turn: tokens the policy drew (`logprobs` set, one per token) or tokens an environment gave (None)."""

    tokens: torch.Tensor  # [T] long
    logprobs: torch.Tensor | None  # [T] float32, policy turns only

    @property
    def from_policy(self) -> bool:
        return self.logprobs is not None


def policy_turn(tokens: Tokens, logprobs: Sequence[float] | torch.Tensor, eos_id: int | None = None,
                max_tokens: int | None = None) -> Turn:
    """A policy turn, cut after its first `eos_id` (kept) or after `max_tokens` tokens, whichever comes first: an
    engine's right-padded output of maxTokensPerTurn tokens becomes the tokens the policy actually said."""
    ids = torch.as_tensor(tokens, dtype=torch.long).flatten().cpu()
    logp = torch.as_tensor(logprobs, dtype=torch.float32).flatten().cpu()
    if ids.shape != logp.shape:
        raise ValueError(f"a policy turn of {ids.numel()} tokens has {logp.numel()} log-probs: give one per token")
    end = ids.numel() if max_tokens is None else min(ids.numel(), max_tokens)
    if eos_id is not None:
        at_eos = (ids[:end] == eos_id).nonzero()
        if at_eos.numel():
            end = int(at_eos[0]) + 1
    return Turn(ids[:end], logp[:end])


def observation_turn(tokens: Tokens) -> Turn:
    """Tokens an environment or a tool gave (the chat template's framing included): context, never trained on."""
    return Turn(torch.as_tensor(tokens, dtype=torch.long).flatten().cpu(), None)


@dataclass(frozen=True)
class Trajectory:
    """One prompt and its turns laid out for training (the module's docstring: shapes and masks)."""

    prompt: torch.Tensor  # [P] long
    responses: torch.Tensor  # [R] long
    response_mask: torch.Tensor  # [R] float: 1 on policy tokens
    response_attention: torch.Tensor  # [R] long: 1 on every real token of the response part
    rollout_logprobs: torch.Tensor  # [R] float32
    turn_ends: tuple[int, ...]  # each policy turn's last token, as an index into responses (per-turn rewards go there)
    truncated: bool  # the turns did not fit in R

    @property
    def input_ids(self) -> torch.Tensor:
        """[P+R] the prompt, then the response."""
        return torch.cat([self.prompt, self.responses])

    @property
    def attention_mask(self) -> torch.Tensor:
        """[P+R] long: 1 on the prompt's tokens and every real response token (observations included)."""
        return torch.cat([torch.ones_like(self.prompt), self.response_attention])


def build_trajectory(prompt_ids: Tokens, turns: Sequence[Turn], width: int, pad_id: int) -> Trajectory:
    """Prompt token ids [P] (no padding) and turns, in order -> a Trajectory of response width `width`."""
    if width < 1:
        raise ValueError(f"the response width must be at least 1, not {width}")
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long).flatten().cpu()
    responses = torch.full((width,), pad_id, dtype=torch.long)
    mask, attention = torch.zeros(width), torch.zeros(width, dtype=torch.long)
    logprobs = torch.zeros(width, dtype=torch.float32)
    at, ends, truncated = 0, [], False
    for turn in turns:
        n = min(turn.tokens.numel(), width - at)
        truncated |= n < turn.tokens.numel()
        if n == 0:
            continue
        responses[at:at + n], attention[at:at + n] = turn.tokens[:n], 1
        if turn.logprobs is not None:
            mask[at:at + n], logprobs[at:at + n] = 1.0, turn.logprobs[:n]
            ends.append(at + n - 1)
        at += n
    return Trajectory(prompt, responses, mask, attention, logprobs, tuple(ends), truncated)


def trajectory_batch(trajectories: Sequence[Trajectory], pad_id: int, prompt_width: int | None = None) -> Batch:
    """Trajectories of one response width -> a Batch as `kuberl.rollout.response_batch` makes it, prompts
    left-padded to `prompt_width` (default: the longest): responses [B, R] long, response_mask [B, R] float,
    input_ids [B, P+R] long, attention_mask [B, P+R] long, rollout_logprobs [B, R] float32; meta turn_ends and
    truncated, per trajectory."""
    if not trajectories:
        raise ValueError("no trajectories to batch")
    widths = {t.responses.numel() for t in trajectories}
    if len(widths) > 1:
        raise ValueError(f"trajectories of different response widths ({sorted(widths)}) cannot be batched")
    longest = max(t.prompt.numel() for t in trajectories)
    p = longest if prompt_width is None else prompt_width
    if p < longest:
        raise ValueError(f"a prompt of {longest} tokens does not fit prompt_width {p}")
    prompts = torch.full((len(trajectories), p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(trajectories), p), dtype=torch.long)
    for row, t in enumerate(trajectories):
        if t.prompt.numel():
            prompts[row, p - t.prompt.numel():], prompt_mask[row, p - t.prompt.numel():] = t.prompt, 1
    responses = torch.stack([t.responses for t in trajectories])
    return Batch({"responses": responses, "response_mask": torch.stack([t.response_mask for t in trajectories]),
                  "input_ids": torch.cat([prompts, responses], dim=1),
                  "attention_mask": torch.cat([prompt_mask, torch.stack([t.response_attention for t in trajectories])],
                                              dim=1),
                  "rollout_logprobs": torch.stack([t.rollout_logprobs for t in trajectories])},
                 {"turn_ends": [t.turn_ends for t in trajectories], "truncated": [t.truncated for t in trajectories]})

"""Log-probabilities and entropy from logits."""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits), [..., V] -> [...], in float32: ``-sum p log p`` with ``log p`` from
    log_softmax (logsumexp of max-shifted logits), so large logits lose no precision to cancellation."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def _label_logprobs(logits: Tensor, labels: Tensor) -> Tensor:
    """Rows of logits [N, V] and labels [N] -> log p(label) [N], in float32."""
    logits = logits.float()
    return logits.gather(-1, labels[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def logprobs_from_logits(logits: Tensor, labels: Tensor, chunk_size: int = 0) -> Tensor:
    """Log-probability of each label: logits [B, T, V], labels [B, T] long -> [B, T] float32.

    With ``chunk_size > 0`` the B*T rows go through in chunks of ``chunk_size``, so at most one chunk's
    float32 copy of the logits exists at a time; under autograd each chunk is recomputed in backward
    (activation checkpointing) instead of keeping its float32 intermediates. Same values and gradients.
    """
    vocab = logits.shape[-1]
    rows, flat_labels = logits.reshape(-1, vocab), labels.reshape(-1)
    if chunk_size <= 0:
        return _label_logprobs(rows, flat_labels).reshape(labels.shape)
    fn = _label_logprobs
    if torch.is_grad_enabled() and logits.requires_grad:
        fn = partial(checkpoint, _label_logprobs, use_reentrant=False)
    chunks = [fn(x, y) for x, y in zip(rows.split(chunk_size), flat_labels.split(chunk_size))]
    return torch.cat(chunks).reshape(labels.shape)

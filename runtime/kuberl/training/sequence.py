"""Forward passes over prompt+response sequences.

Layout: `input_ids` [B, P+R] = left-padded prompt (P) then right-padded response (R);
`attention_mask` [B, P+R] is 1 on real tokens; `response_mask` [B, R] is 1 on response tokens up to
and including EOS. The prediction for response token t comes from position P+t-1.
"""

from __future__ import annotations

import torch
from torch import nn

from kuberl.algos import entropy_from_logits, logprobs_from_logits
from kuberl.training.kernels.lm_head import fusable, fused_head
from kuberl.training.packing import pack

SEQ_KEYS = ("input_ids", "attention_mask", "responses", "response_mask")
"""The Batch keys of a prompt+response sequence (the layout above): what every role's forward pass over a
rollout reads."""


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] positions that skip left padding (pad positions get 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def response_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    resp_len: int) -> torch.Tensor:
    """Logits predicting each response token: [B, R, V]. Only R+1 positions go through the LM head."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                logits_to_keep=resp_len + 1, use_cache=False)
    return out.logits[:, :-1]


def response_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      responses: torch.Tensor, temperature: float = 1.0, chunk_size: int = 0,
                      with_entropy: bool = False, entropy_grad: bool = False,
                      fused: bool | None = None, compile: bool = False,
                      response_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(response token) [B, R] (float32), and optionally the entropy [B, R] (differentiable
    only when `entropy_grad`, i.e. when an entropy bonus is trained).

    With `fused` (default: whenever `chunk_size > 0`) and an HF causal LM with a Linear head, the LM
    head, log-softmax and entropy run together in row chunks of `chunk_size` (`kernels.lm_head`): no
    [B, R, V] logits tensor is ever materialised, in any dtype; `compile` compiles its chunk math.
    Otherwise the logits are computed and `logprobs_from_logits` runs over them in chunks.

    With `response_mask` [B, R] the rows are packed (`kuberl.training.packing`; the model must use its varlen
    attention, `packing.use_varlen`): no pad token is computed, and only the trained response tokens are
    predicted; log p and entropy are 0 where the mask is 0.
    """
    if fused is None:
        fused = chunk_size > 0
    packed = pack(input_ids, attention_mask, response_mask) if response_mask is not None else None
    if fused and fusable(model):
        ent_grad = bool(with_entropy and entropy_grad and torch.is_grad_enabled())
        head = fused_head(model)
        if packed is None:
            out = head(input_ids, attention_mask, position_ids(attention_mask), responses, temperature, chunk_size,
                       with_entropy, ent_grad, compile)
        else:
            out = head(packed.input_ids, None, packed.position_ids, packed.labels, temperature, chunk_size,
                       with_entropy, ent_grad, compile, packed.source, packed.attention_kwargs())
        logp, ent = (packed.unpack(x) for x in out.unbind(0)) if packed is not None else out.unbind(0)
        if not with_entropy:
            return logp, None
        return logp, (ent if ent_grad else ent.detach())
    if packed is None:
        logits, labels = response_logits(model, input_ids, attention_mask, responses.shape[1]), responses
    else:
        logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids, logits_to_keep=packed.source,
                       use_cache=False, **packed.attention_kwargs()).logits[0]  # [M, V]
        labels = packed.labels
    if temperature != 1.0:
        logits = logits / temperature
    logp = logprobs_from_logits(logits, labels, chunk_size=chunk_size)
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = entropy_from_logits(logits if entropy_grad else logits.detach())
    if packed is not None:
        logp, ent = packed.unpack(logp), (packed.unpack(ent) if ent is not None else None)
    return logp, ent


def response_values(critic: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    resp_len: int, response_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Critic values of the state before each response token: [B, R] (float32). With `response_mask` [B, R] the
    rows are packed (see `response_logprobs`) and the values are 0 where the mask is 0."""
    if response_mask is None:
        values = critic(input_ids=input_ids, attention_mask=attention_mask)
        return values[:, -resp_len - 1 : -1]
    packed = pack(input_ids, attention_mask, response_mask)
    values = critic(input_ids=packed.input_ids, attention_mask=None, position_ids=packed.position_ids,
                    **packed.attention_kwargs())  # [1, N]
    return packed.unpack(values[0, packed.source])


def response_mask(responses: torch.Tensor, eos_id: int | None) -> torch.Tensor:
    """[B, R] float mask: 1 up to and including the first EOS; generated padding after it is 0. With `eos_id`
    None (fixed-length rollouts) all ones: each of the R tokens was drawn, the pad token's id included (a
    token of the vocabulary like any other; taken for padding, it made a micro-batch padded at random)."""
    if eos_id is None:
        return torch.ones_like(responses, dtype=torch.float)
    is_eos = (responses == eos_id).long()
    before_or_at_eos = (is_eos.cumsum(-1) - is_eos) == 0
    return before_or_at_eos.float()


def decode_responses(tokenizer, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """Response text [B] up to (not including) EOS, from responses [B, R] and their mask [B, R]."""
    eos = tokenizer.eos_token_id
    kept = [[t for t, keep in zip(ids, m) if keep and t != eos] for ids, m in zip(responses.tolist(), mask.tolist())]
    return tokenizer.batch_decode(kept, skip_special_tokens=True)

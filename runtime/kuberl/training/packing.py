"""Sequence packing: a micro-batch's prompt+response rows laid end to end as one row of real tokens, so that no
pad token enters a matmul. Each sequence keeps its own position ids (from 0), and attention stays inside it:
`varlen_attention`, registered with transformers as the attention implementation `VARLEN`, runs flash
attention's varlen kernel on CUDA (`torch.nn.attention.varlen`) and one causal SDPA per sequence elsewhere.

Only the positions that predict a response token (`Packed.source`) reach the LM head or the value head; their
results go back to the padded [B, R] layout (`Packed.unpack`), zero where the response mask is 0, so the losses
read them as they read the padded path's.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

VARLEN = "kuberl_varlen"
"""The attention implementation's name under transformers' AttentionInterface."""


def bucket(n: int) -> int:
    """The power of two at or above `n` tokens. Flash varlen only sizes its grid by the longest sequence (an upper
    bound does), and a compiled block specializes on it: a bucket costs a few compiles, each exact length one."""
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class Packed:
    """B prompt+response rows packed into one: N real tokens, M of them predicting a response token."""

    input_ids: torch.Tensor  # [1, N] the rows' real tokens, row after row
    position_ids: torch.Tensor  # [1, N] each sequence's positions, from 0
    cu_seqlens: torch.Tensor  # [B + 1] int32: where each sequence starts in the packed row, then N
    max_len: int  # at least the longest sequence's tokens: the next power of two (`bucket`)
    source: torch.Tensor  # [M] packed positions whose next token is a response token under the response mask
    labels: torch.Tensor  # [M] the response tokens they predict
    dest: torch.Tensor  # [M] where each goes in the flattened [B, R] layout
    shape: tuple[int, int]  # (B, R)

    def attention_kwargs(self) -> dict:
        """The keyword arguments that carry the sequence bounds through an HF model to `varlen_attention` (the
        names of transformers' FlashAttentionKwargs)."""
        return {"cu_seq_lens_q": self.cu_seqlens, "cu_seq_lens_k": self.cu_seqlens,
                "max_length_q": self.max_len, "max_length_k": self.max_len}

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """values [M] (one per predicting position) -> [B, R], zero where the response mask is 0; differentiable."""
        b, r = self.shape
        out = values.new_zeros(b * r)
        return out.index_copy(0, self.dest, values).view(b, r)


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor) -> Packed:
    """Rows input_ids [B, P+R] (left-padded prompt, then the response), their attention_mask [B, P+R] (1 on real
    tokens) and response_mask [B, R] (1 on the response tokens trained on) -> `Packed`.
    Every row needs a real prompt token, and the response mask must lie inside the attention mask."""
    keep = attention_mask.bool()
    b, r = response_mask.shape
    p = input_ids.shape[1] - r
    lengths = keep.sum(1)
    packed_at = keep.flatten().long().cumsum(0).view_as(keep) - 1  # [B, P+R]: a kept token's packed position
    trained = response_mask.bool()
    if bool((trained & ~keep[:, p:]).any() | (~keep[:, :p]).all(1).any()):  # one host sync
        raise ValueError("spec.trainer.packing: packed sequences need a real prompt token in every row (an empty "
                         "prompt under a tokenizer with no BOS token has none) and the response mask inside the "
                         "attention mask: drop empty prompts from the dataset, or set spec.trainer.packing false and "
                         "remove spec.trainer.maxTokensPerMicroBatch")
    positions = (attention_mask.long().cumsum(-1) - 1)[keep]
    return Packed(input_ids=input_ids[keep][None], position_ids=positions[None],
                  cu_seqlens=F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32), max_len=bucket(int(lengths.max())),
                  source=packed_at[:, p:][trained] - 1, labels=input_ids[:, p:][trained],
                  dest=trained.flatten().nonzero().squeeze(1), shape=(b, r))


def _flash_varlen():
    """torch's flash-attention varlen kernel and whether it takes `enable_gqa` (torch >= 2.9; CUDA, fp16 and bf16)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, False
    return varlen_attn, "enable_gqa" in inspect.signature(varlen_attn).parameters


FLASH_VARLEN, FLASH_GQA = _flash_varlen()  # resolved once: the attention runs inside compiled blocks
FLASH_DTYPES = (torch.float16, torch.bfloat16)
UNSUPPORTED = ("sliding_window", "softcap", "s_aux")  # attention kwargs that packing does not implement


def varlen_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface. query [1, H, N, D], key and value [1, Hkv, N, D] of a packed row with
    `cu_seq_lens_q` in kwargs -> ([1, N, H, D], None): causal attention inside each sequence. Without
    `cu_seq_lens_q` (a padded batch) it is transformers' SDPA attention, unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    unsupported = [k for k in UNSUPPORTED if kwargs.get(k) is not None]
    if unsupported:
        raise ValueError(f"packed sequences do not support this model's attention ({', '.join(unsupported)}): set "
                         "spec.trainer.packing false and remove spec.trainer.maxTokensPerMicroBatch")
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [N, heads, D]
    if q.is_cuda and q.dtype in FLASH_DTYPES and FLASH_VARLEN is not None and dropout == 0.0:
        if not FLASH_GQA and k.shape[1] != q.shape[1]:
            k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
        extra = {"enable_gqa": True} if FLASH_GQA else {}
        out = FLASH_VARLEN(q, k, v, cu, cu, kwargs["max_length_q"], kwargs["max_length_k"], scale=scaling,
                           window_size=(-1, 0), **extra)
        return out[None], None
    bounds = cu.tolist()
    parts = [F.scaled_dot_product_attention(q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1),
                                            dropout_p=dropout, is_causal=True, scale=scaling,
                                            enable_gqa=k.shape[1] != q.shape[1]).transpose(0, 1)
             for s, e in zip(bounds[:-1], bounds[1:]) if e > s]
    return torch.cat(parts)[None], None


def _varlen_mask(**kwargs) -> torch.Tensor | None:
    """transformers' mask interface for `VARLEN`: no mask for a packed row (the bounds travel in the attention
    kwargs), SDPA's for a padded batch."""
    from transformers.masking_utils import sdpa_mask

    return None if kwargs.get("attention_mask") is None else sdpa_mask(**kwargs)


def use_varlen(model: nn.Module) -> None:
    """Register `VARLEN` with transformers (once) and make it `model`'s attention implementation (an HF
    PreTrainedModel: a causal LM, or a critic's trunk). Padded batches still run SDPA through it. Refuses a model
    with sliding-window layers (a `sliding_window` it does not turn off, as Mistral's), or one that keeps its own
    attention (transformers only warns): either would attend
    across the packed sequences."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    cfg, fix = model.config, "set spec.trainer.packing false and remove spec.trainer.maxTokensPerMicroBatch"
    windowed = getattr(cfg, "sliding_window", None) is not None and getattr(cfg, "use_sliding_window", True)
    if windowed or "sliding_attention" in (getattr(cfg, "layer_types", None) or ()):
        raise ValueError(f"{cfg.model_type} has sliding-window attention layers, which packing does not support: {fix}")
    AttentionInterface.register(VARLEN, varlen_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(VARLEN, _varlen_mask)
    model.set_attn_implementation(VARLEN)
    if cfg._attn_implementation != VARLEN:
        raise ValueError(f"{cfg.model_type} cannot change its attention implementation, so its sequences cannot be "
                         f"packed: {fix}")

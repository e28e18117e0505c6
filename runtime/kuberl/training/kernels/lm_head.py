"""Fused LM head + log-softmax (+ entropy) in row chunks: no [N, V] logits tensor is ever materialised.

`linear_logprobs` is the kernel (a custom autograd function whose chunk math is optionally compiled);
`fused_head(model)` runs it as a forward method of an HF causal LM, registered with FSDP2.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import register_fsdp_forward_method


def _chunk_forward(logits: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool):
    """One chunk of rows: logits [n, V] -> log p(label), logsumexp, entropy [n] in float32 (float64 for
    float64 logits). Pure, so that inductor can fuse it into a few passes over the chunk."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature != 1.0:
        x = x / temperature
    m = torch.logsumexp(x, dim=-1)
    logp = x.gather(1, labels[:, None]).squeeze(1) - m
    if with_entropy:
        ent = m - (torch.exp(x - m[:, None]) * x).sum(-1)
    else:
        ent = torch.zeros_like(m)
    return logp, m, ent


def _chunk_backward(logits: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor, ent: torch.Tensor,
                    g_logp: torch.Tensor, g_ent: torch.Tensor, temperature: float, with_entropy: bool) -> torch.Tensor:
    """d(loss)/d(logits) for one chunk, in the logits' dtype:
    g_logp * (onehot(label) - p) / T  -  g_ent * p * (log p + H) / T."""
    x = logits.to(lse.dtype)
    if temperature != 1.0:
        x = x / temperature
    p = torch.exp(x - lse[:, None])
    gx = -p * g_logp[:, None]
    if with_entropy:
        gx = gx - g_ent[:, None] * p * (x - lse[:, None] + ent[:, None])
    if torch.compiler.is_compiling():  # fused into the same pass by inductor
        cols = torch.arange(x.shape[1], device=x.device)[None, :]
        gx = gx + torch.where(cols == labels[:, None], g_logp[:, None], 0.0)
    else:
        gx = gx.scatter_add(1, labels[:, None], g_logp[:, None])
    if temperature != 1.0:
        gx = gx / temperature
    return gx.to(logits.dtype)


_compiled: dict[bool, tuple[Callable, Callable]] = {}  # the compiled chunk functions (static, dynamic), on first use


def _chunk_fns(compile: bool, dynamic: bool = False) -> tuple[Callable, Callable]:
    """The chunk math, compiled by torch.compile (inductor fuses it) or eager. `dynamic`: rows that vary from call to
    call (packed sequences: each micro-batch predicts its own count of tokens) get kernels for any row count, where
    static ones would recompile for each new count; padded batches keep their fixed shapes' static kernels."""
    if not compile:
        return _chunk_forward, _chunk_backward
    if dynamic not in _compiled:
        _compiled[dynamic] = (torch.compile(_chunk_forward, dynamic=dynamic, fullgraph=True),
                              torch.compile(_chunk_backward, dynamic=dynamic, fullgraph=True))
    return _compiled[dynamic]


class _LinearLogprobs(torch.autograd.Function):
    """rows hidden [N, H], head weight [V, H], labels [N] -> (log p(label) [N], entropy [N]), float32,
    for p = softmax(hidden @ weight.T / temperature).

    Forward keeps only hidden, weight, labels and two floats per row (logsumexp, entropy); backward
    recomputes each chunk's logits (one extra [n, H] x [H, V] matmul per chunk) instead of storing
    a [N, V] tensor. d log p_y / dx = onehot(y) - p;  dH / dx = -p (log p + H). The per-chunk
    elementwise math (`_chunk_forward`, `_chunk_backward`) is compiled when `compile` is set (on
    CUDA): a few passes over the chunk's bf16 logits instead of a dozen float32 ones.
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature: float, chunk: int, with_entropy: bool, entropy_grad: bool,
                compile: bool, dynamic: bool):
        fwd, _ = _chunk_fns(compile, dynamic)
        parts = [fwd(F.linear(hidden[s : s + chunk], weight), labels[s : s + chunk], temperature, with_entropy)
                 for s in range(0, hidden.shape[0], chunk)]
        logp, lse, ent = (torch.cat(x) for x in zip(*parts))
        ctx.save_for_backward(hidden, weight, labels, lse, ent)
        ctx.temperature, ctx.chunk, ctx.compile, ctx.dynamic = temperature, chunk, compile, dynamic
        ctx.with_entropy, ctx.entropy_grad = with_entropy, with_entropy and entropy_grad
        ctx.set_materialize_grads(False)
        logp_out, ent_out = logp.float(), ent.float()
        if not with_entropy:
            ctx.mark_non_differentiable(ent_out)
        return logp_out, ent_out

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, labels, lse, ent = ctx.saved_tensors
        t, chunk = ctx.temperature, ctx.chunk
        use_ent = ctx.entropy_grad and g_ent is not None
        if g_logp is None and not use_ent:
            return None, None, None, None, None, None, None, None, None
        g_logp = torch.zeros_like(lse) if g_logp is None else g_logp.to(lse.dtype)
        g_ent = g_ent.to(lse.dtype) if use_ent else torch.zeros_like(lse)
        _, bwd = _chunk_fns(ctx.compile, ctx.dynamic)
        n = hidden.shape[0]
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        want_w = ctx.needs_input_grad[1]
        grad_w = acc = None
        n_chunks = (n + chunk - 1) // chunk
        for s in range(0, n, chunk):
            h = hidden[s : s + chunk]
            e = s + h.shape[0]
            gx = bwd(F.linear(h, weight), labels[s:e], lse[s:e], ent[s:e], g_logp[s:e], g_ent[s:e], t, use_ent)
            if grad_h is not None:
                grad_h[s:e] = gx @ weight
            if want_w:
                gw = gx.t() @ h
                if n_chunks == 1:
                    grad_w = gw
                else:
                    acc = gw.to(lse.dtype) if acc is None else acc.add_(gw)
        if want_w and acc is not None:
            grad_w = acc.to(weight.dtype)
        return grad_h, grad_w, None, None, None, None, None, None, None


def default_chunk_rows(vocab: int) -> int:
    """Rows per chunk so that one float32 [rows, vocab] buffer is about 1 GiB."""
    return max(16, (1 << 28) // max(vocab, 1))


def linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                    chunk_size: int = 0, with_entropy: bool = False, entropy_grad: bool = False,
                    compile: bool = False, dynamic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused LM head + log-softmax (+ entropy): hidden [..., H], weight [V, H], labels [...] ->
    log p(label) [...] and entropy [...] (zeros unless `with_entropy`), both float32. Gradients
    flow to hidden and weight through log p, and through the entropy when `entropy_grad`. With
    `compile` the per-chunk elementwise math goes through torch.compile; `dynamic` when the row count varies
    between calls (`_chunk_fns`)."""
    shape = labels.shape
    if labels.numel() == 0:  # nothing to predict (a packed micro-batch without a trained token): still in the graph
        zero = (hidden.sum() + weight.sum()) * 0
        return zero.float().expand(shape), zero.float().expand(shape)
    chunk = chunk_size if chunk_size > 0 else default_chunk_rows(weight.shape[0])
    logp, ent = _LinearLogprobs.apply(hidden.reshape(-1, hidden.shape[-1]), weight, labels.reshape(-1),
                                      float(temperature), int(chunk), bool(with_entropy), bool(entropy_grad),
                                      bool(compile), bool(dynamic))
    return logp.view(shape), ent.view(shape)


def fusable(model: nn.Module) -> bool:
    """An HF causal LM whose output head is a bias-free Linear and whose logits are used as they are."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    cfg = getattr(model, "config", None)
    return (isinstance(head, nn.Linear) and head.bias is None and cfg is not None
            and getattr(cfg, "final_logit_softcapping", None) is None and getattr(cfg, "logit_scale", None) is None)


FUSED_METHOD = "kuberl_response_logprobs"


def _response_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                       position_ids: torch.Tensor, responses: torch.Tensor, temperature: float, chunk_size: int,
                       with_entropy: bool, entropy_grad: bool, compile: bool, source: torch.Tensor | None = None,
                       attention: dict | None = None) -> torch.Tensor:
    """The fused-head forward of an HF causal LM: its trunk, then `linear_logprobs` on the R positions
    that predict the responses: [2, B, R] = (log p, entropy), one new tensor (not a view, so FSDP2's
    pre-backward hook on it holds). Runs as a forward method of the model (see `fused_head`), so
    that FSDP2 gathers the root's parameters (embeddings, final norm, the tied head) for it.
    A packed row (`kuberl.training.packing`): input_ids [1, N], `source` [M] the positions that predict
    `responses` [M], `attention` the sequence bounds -> [2, M]."""
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              use_cache=False, **(attention or {})).last_hidden_state
    rows = hidden[0, source] if source is not None else hidden[:, -responses.shape[1] - 1 : -1]
    head = model.get_output_embeddings()
    return torch.stack(linear_logprobs(rows, head.weight, responses, temperature, chunk_size, with_entropy,
                                       entropy_grad, compile, dynamic=source is not None))


def fused_head(model: nn.Module) -> Callable[..., torch.Tensor]:
    """`model`'s fused-head forward method, added on first use: `model.kuberl_response_logprobs(input_ids,
    attention_mask, position_ids, responses, temperature, chunk_size, with_entropy, entropy_grad, compile[, source,
    attention])` -> [2, B, R] = (log p, entropy), or for a packed row (`source`, `attention`) [2, M]. Under FSDP2
    it is registered with `register_fsdp_forward_method`, FSDP2's supported way to run a method other than
    `forward` with gathered parameters (and their gradients reduced in backward); without FSDP it is a plain
    method. The model's own `forward` is left as it is."""
    method = getattr(model, FUSED_METHOD, None)
    if method is None:
        setattr(model, FUSED_METHOD, types.MethodType(_response_logprobs, model))
        register_fsdp_forward_method(model, FUSED_METHOD)
        method = getattr(model, FUSED_METHOD)
    return method

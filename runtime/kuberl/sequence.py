"""Forward passes over prompt+response sequences.

Layout: `input_ids` [B, P+R] = left-padded prompt (P) then right-padded response (R);
`attention_mask` [B, P+R] is 1 on real tokens; `response_mask` [B, R] is 1 on response tokens up to
and including EOS. The prediction for response token t comes from position P+t-1.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from .algos import entropy_from_logits, logprobs_from_logits
from .dist import compile_enabled


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] positions that skip left padding (pad positions get 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def response_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, resp_len: int) -> torch.Tensor:
    """Logits predicting each response token: [B, R, V]. Only R+1 positions go through the LM head."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                logits_to_keep=resp_len + 1, use_cache=False)
    return out.logits[:, :-1]


def response_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      responses: torch.Tensor, temperature: float = 1.0, chunk_size: int = 0,
                      with_entropy: bool = False, entropy_grad: bool = False,
                      fused: bool | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(response token) [B, R] (float32), and optionally the entropy [B, R] (differentiable
    only when `entropy_grad`, i.e. when an entropy bonus is trained).

    With `fused` (default: whenever `chunk_size > 0`) and an HF causal LM with a Linear head, the LM
    head, log-softmax and entropy run together in row chunks of `chunk_size` (`linear_logprobs`): no
    [B, R, V] logits tensor is ever materialised, in any dtype. Otherwise the logits are computed and
    `logprobs_from_logits` runs over them in chunks.
    """
    if fused is None:
        fused = chunk_size > 0
    if fused and fusable(model):
        return _fused_response_logprobs(model, input_ids, attention_mask, responses, temperature, chunk_size,
                                        with_entropy, entropy_grad)
    logits = response_logits(model, input_ids, attention_mask, responses.shape[1])
    if temperature != 1.0:
        logits = logits / temperature
    logp = logprobs_from_logits(logits, responses, chunk_size=chunk_size)
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = entropy_from_logits(logits if entropy_grad else logits.detach())
    return logp, ent


# --------------------------------------------------------------------------- fused LM head + log-softmax


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


# None: torch.compile the chunk math on CUDA unless KUBERL_COMPILE=0; True/False force it (benchmarks).
COMPILE_HEAD: bool | None = None
_compiled: dict[str, object] = {}


def _chunk_fns(device: torch.device):
    use = COMPILE_HEAD if COMPILE_HEAD is not None else compile_enabled(device)
    if not use:
        return _chunk_forward, _chunk_backward
    if not _compiled:
        _compiled["fwd"] = torch.compile(_chunk_forward, dynamic=False, fullgraph=True)
        _compiled["bwd"] = torch.compile(_chunk_backward, dynamic=False, fullgraph=True)
    return _compiled["fwd"], _compiled["bwd"]


class _LinearLogprobs(torch.autograd.Function):
    """rows hidden [N, H], head weight [V, H], labels [N] -> (log p(label) [N], entropy [N]), float32,
    for p = softmax(hidden @ weight.T / temperature).

    Forward keeps only hidden, weight, labels and two floats per row (logsumexp, entropy); backward
    recomputes each chunk's logits (one extra [n, H] x [H, V] matmul per chunk) instead of storing
    a [N, V] tensor. d log p_y / dx = onehot(y) - p;  dH / dx = -p (log p + H). The per-chunk
    elementwise math (`_chunk_forward`, `_chunk_backward`) is compiled on CUDA: a few passes over
    the chunk's bf16 logits instead of a dozen float32 ones.
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature: float, chunk: int, with_entropy: bool, entropy_grad: bool):
        fwd, _ = _chunk_fns(hidden.device)
        parts = [fwd(F.linear(hidden[s : s + chunk], weight), labels[s : s + chunk], temperature, with_entropy)
                 for s in range(0, hidden.shape[0], chunk)]
        logp, lse, ent = (torch.cat(x) for x in zip(*parts))
        ctx.save_for_backward(hidden, weight, labels, lse, ent)
        ctx.temperature, ctx.chunk = temperature, chunk
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
            return None, None, None, None, None, None, None
        g_logp = torch.zeros_like(lse) if g_logp is None else g_logp.to(lse.dtype)
        g_ent = g_ent.to(lse.dtype) if use_ent else torch.zeros_like(lse)
        _, bwd = _chunk_fns(hidden.device)
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
        return grad_h, grad_w, None, None, None, None, None


def default_chunk_rows(vocab: int) -> int:
    """Rows per chunk so that one float32 [rows, vocab] buffer is about 1 GiB."""
    return max(16, (1 << 28) // max(vocab, 1))


def linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                    chunk_size: int = 0, with_entropy: bool = False,
                    entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused LM head + log-softmax (+ entropy): hidden [..., H], weight [V, H], labels [...] ->
    log p(label) [...] and entropy [...] (zeros unless `with_entropy`), both float32. Gradients
    flow to hidden and weight through log p, and through the entropy when `entropy_grad`."""
    shape = labels.shape
    chunk = chunk_size if chunk_size > 0 else default_chunk_rows(weight.shape[0])
    logp, ent = _LinearLogprobs.apply(hidden.reshape(-1, hidden.shape[-1]), weight, labels.reshape(-1),
                                      float(temperature), int(chunk), bool(with_entropy), bool(entropy_grad))
    return logp.view(shape), ent.view(shape)


def fusable(model: nn.Module) -> bool:
    """An HF causal LM whose output head is a bias-free Linear and whose logits are used as they are."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    cfg = getattr(model, "config", None)
    return (isinstance(head, nn.Linear) and head.bias is None and cfg is not None
            and getattr(cfg, "final_logit_softcapping", None) is None and getattr(cfg, "logit_scale", None) is None)


def _head_forward(self: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """The output head's forward: a plain Linear, unless a fused log-prob request is pending, in which
    case it returns [B, R, 2] = (log p(label), entropy) instead of logits. Running inside the model's
    forward keeps FSDP2's unsharded weight (and its gradient reduction) in play."""
    req = self.__dict__.get("_kuberl_request")
    if req is None:
        return F.linear(hidden, self.weight, self.bias)
    labels, temperature, chunk, with_entropy, entropy_grad = req
    logp, ent = linear_logprobs(hidden, self.weight, labels, temperature, chunk, with_entropy, entropy_grad)
    return torch.stack([logp, ent], dim=-1)


def _fused_response_logprobs(model, input_ids, attention_mask, responses, temperature, chunk_size,
                             with_entropy, entropy_grad):
    head = model.get_output_embeddings()
    if not head.__dict__.get("_kuberl_fused_head"):
        head.forward = types.MethodType(_head_forward, head)
        head._kuberl_fused_head = True
    r = responses.shape[1]
    ent_grad = bool(with_entropy and entropy_grad and torch.is_grad_enabled())
    head._kuberl_request = (responses, temperature, chunk_size, with_entropy, ent_grad)
    try:
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                    logits_to_keep=slice(-r - 1, -1), use_cache=False).logits
    finally:
        head._kuberl_request = None
    logp, ent = out[..., 0], out[..., 1]
    if not with_entropy:
        return logp, None
    return logp, (ent if ent_grad else ent.detach())


def response_values(critic: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, resp_len: int) -> torch.Tensor:
    """Critic values of the state before each response token: [B, R] (float32)."""
    values = critic(input_ids=input_ids, attention_mask=attention_mask)
    return values[:, -resp_len - 1 : -1]


def response_mask(responses: torch.Tensor, eos_id: int | None, pad_id: int) -> torch.Tensor:
    """[B, R] float mask: 1 up to and including the first EOS; generated padding after it is 0."""
    if eos_id is None:
        return (responses != pad_id).float() if pad_id is not None else torch.ones_like(responses, dtype=torch.float)
    is_eos = (responses == eos_id).long()
    before_or_at_eos = (is_eos.cumsum(-1) - is_eos) == 0
    return before_or_at_eos.float()

"""Fast batched decoding for the `hf` engine: a static KV cache and a CUDA-graph-captured decode step.

`StaticDecoder` runs its own forward pass over the *parameters of a Hugging Face causal LM* (Qwen2- and
Llama-shaped models: RMSNorm, rotary attention with grouped KV heads, SwiGLU MLP). At construction it
re-homes each layer's q/k/v projections into one [q + 2 kv, H] tensor and gate/up into one [2 I, H]
tensor, and points the model's own parameters at row slices of them: the decode step runs one GEMM for
QKV and one for gate/up, while the model, its `state_dict` and the engine's in-place `load_weights`
(a `copy_` into those parameters) still work and write into the fused tensors. The captured graphs read
those very tensors, so they stay valid across weight syncs.

One `generate` call:
    prefill   eager: the left-padded prompts [B, P] through every layer; each prompt's K/V go to cache
              slots 0..len-1 of its own row (left-aligned: the padding is dropped); the first token is
              sampled from the last position's logits
    decode    R-1 replays of one captured step: embed the current token, write its K/V at slot
              len + t, attend over slots 0..len + t, sample the next token; every bit of state (slots,
              finished flags, outputs, the noise key) lives in device tensors that the step updates
              itself, so a replay needs no host work

The cache is one tensor [layers, 2 (K, V), B * S, kv_heads, head_dim] (S = P + R rounded up to 16): row
b's slots are b*S .. b*S + S-1, and its valid keys are always a prefix. Decode attention therefore
needs no mask:
- `flash` (CUDA, bf16/fp16): torch's FlashAttention-2 varlen kernel with `seqused_k`, which reads only
  each row's used slots (grouped-query heads natively); checked against `sdpa` once at start-up and
  not used if it disagrees or is missing;
- `sdpa` (any device and dtype; fp32 and CPU): SDPA over all S slots with an additive bias built from
  the used lengths, the query heads of one KV head as extra query rows.

With `compile=True` the pure parts of the decode step go through `torch.compile` (inductor), in three
shapes reused by every layer: (norm + QKV + rotary) for layer 0, (output projection + norm + MLP +
next layer's norm + QKV + rotary) between layers, (output projection + norm + MLP) for the last layer;
and the final norm + LM head + sampling (`sampling.py`: a few reductions over the logits, no sort). The
compiled kernels are then captured in the same CUDA graph. On CPU the same step runs eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .sampling import SamplingParams, rollout_logprobs, sample_scalars

log = logging.getLogger(__name__)

__all__ = ["SamplingParams", "StaticDecoder", "unsupported_reason"]

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
SUPPORTED_ROPE = ("default", "linear", "llama3")
ATTENTION_BACKENDS = ("auto", "flash", "sdpa")
DEFAULT_SAMPLING = SamplingParams()  # immutable: safe as a default argument


def unsupported_reason(model: nn.Module) -> str | None:
    """Why `StaticDecoder` cannot run this model, or None when it can."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return f"model type {getattr(cfg, 'model_type', None)!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (only silu)"
    if getattr(cfg, "mlp_bias", False):
        return "mlp_bias"
    if getattr(cfg, "use_sliding_window", False) or "sliding_attention" in (getattr(cfg, "layer_types", None) or []):
        return "sliding-window attention"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in SUPPORTED_ROPE:
        return f"rope type {rope_type!r}"
    if not isinstance(getattr(model, "lm_head", None), nn.Linear) or model.lm_head.bias is not None:
        return "lm_head is not a bias-free Linear"
    return None


# --------------------------------------------------------------------------- fused weights


class LayerWeights(NamedTuple):
    ln1: torch.Tensor
    wqkv: torch.Tensor             # [q + 2 kv, H]: q_proj, k_proj, v_proj stacked (the HF params are views)
    bqkv: torch.Tensor | None   # [q + 2 kv] or None
    wo: torch.Tensor
    bo: torch.Tensor | None
    ln2: torch.Tensor
    wgu: torch.Tensor              # [2 I, H]: gate_proj, up_proj stacked (the HF params are views)
    wd: torch.Tensor


@torch.no_grad()
def _fuse(params: list[nn.Parameter]) -> torch.Tensor:
    """One tensor whose leading-dim slices are `params` (same order); the params become views of it.

    Idempotent: params that already are consecutive slices of one buffer return that buffer's span."""
    base = params[0].data
    rows = sum(p.shape[0] for p in params)
    if all(p.is_contiguous() for p in params) and base.is_contiguous():
        expected = base.data_ptr()
        for p in params:
            if p.data_ptr() != expected or p.untyped_storage().data_ptr() != base.untyped_storage().data_ptr():
                break
            expected += p.numel() * p.element_size()
        else:
            return base.as_strided((rows, *base.shape[1:]), base.stride())
    fused = torch.cat([p.data for p in params])
    start = 0
    for p in params:
        p.data = fused[start:start + p.shape[0]]
        start += p.shape[0]
    return fused


def fused_layers(model: nn.Module) -> list[LayerWeights]:
    """Per-layer weights with QKV and gate/up fused (re-homes the model's parameters; see module docstring)."""
    out = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        projections = (a.q_proj, a.k_proj, a.v_proj)
        wqkv = _fuse([p.weight for p in projections])
        bqkv = _fuse([p.bias for p in projections]) if a.q_proj.bias is not None else None
        wgu = _fuse([m.gate_proj.weight, m.up_proj.weight])
        out.append(LayerWeights(layer.input_layernorm.weight, wqkv, bqkv, a.o_proj.weight, a.o_proj.bias,
                                layer.post_attention_layernorm.weight, wgu, m.down_proj.weight))
    return out


# --------------------------------------------------------------------------- the functional forward


class Dims(NamedTuple):
    heads: int
    kv_heads: int
    head_dim: int
    eps: float


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF RMSNorm: normalise in float32, cast back, then scale."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on [B, T, heads, D] with cos/sin [B, T, 1, D] (rotate_half convention)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def qkv_part(h: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor,
             d: Dims) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[B, T, H] -> q [B, T, heads, D], k and v [B, T, kv_heads, D] (rotary applied to q and k)."""
    b, t, _ = h.shape
    qs, kvs = d.heads * d.head_dim, d.kv_heads * d.head_dim
    y = F.linear(rms_norm(h, w.ln1, d.eps), w.wqkv, w.bqkv)
    q, k, v = y.split((qs, kvs, kvs), dim=-1)
    q = q.view(b, t, d.heads, d.head_dim)
    k = k.view(b, t, d.kv_heads, d.head_dim)
    return rotate(q, cos, sin), rotate(k, cos, sin), v.view(b, t, d.kv_heads, d.head_dim)


def mlp_part(h: torch.Tensor, attn: torch.Tensor, w: LayerWeights, eps: float) -> torch.Tensor:
    """Residual stream after the attention output projection and the SwiGLU MLP."""
    h = h + F.linear(attn, w.wo, w.bo)
    gate, up = F.linear(rms_norm(h, w.ln2, eps), w.wgu).chunk(2, dim=-1)
    return h + F.linear(F.silu(gate) * up, w.wd)


def decode_qkv(h: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor,
               d: Dims) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row: h [B, H] -> q [B, heads, D] and kv [2, B, kv_heads, D] (rotated K, then V)."""
    q, k, v = qkv_part(h[:, None], w, cos, sin, d)
    return q[:, 0].contiguous(), torch.stack((k[:, 0], v[:, 0]))


def decode_between(h: torch.Tensor, attn: torch.Tensor, w: LayerWeights, w_next: LayerWeights, cos: torch.Tensor,
                   sin: torch.Tensor, d: Dims) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer i's output projection and MLP, then layer i+1's norm, QKV and rotary: (h, q, kv)."""
    h = mlp_part(h, attn, w, d.eps)
    return (h, *decode_qkv(h, w_next, cos, sin, d))


def decode_last(h: torch.Tensor, attn: torch.Tensor, w: LayerWeights, d: Dims) -> torch.Tensor:
    return mlp_part(h, attn, w, d.eps)


def head_sample(h: torch.Tensor, norm: torch.Tensor, lm_head: torch.Tensor, seed: torch.Tensor, step: torch.Tensor,
                eps: float, greedy: bool, temperature: float, top_p: float, suppress_eos: bool,
                eos_id: int | None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Final norm, LM head and sampling: h [B, H] -> tokens [B], unresolved nucleus rows [B] or None, and the
    tokens' rollout log-probs [B] (`rollout_logprobs`). The sampling parameters are Python scalars, which
    torch.compile specialises on."""
    logits = F.linear(rms_norm(h, norm, eps), lm_head)
    tokens, unresolved = sample_scalars(logits, greedy, temperature, top_p, suppress_eos, eos_id, seed, step)
    return tokens, unresolved, rollout_logprobs(logits, tokens, temperature, eos_id if suppress_eos else None)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """Grouped-query attention without repeating K/V: q [B, T, h, D], k/v [B, T, kv, D], bias [B, 1, T, T]
    (additive) -> [B, T, h*D]. The h/kv query heads that share a KV head become extra query rows."""
    b, t, h, dim = q.shape
    kv = k.shape[2]
    g = h // kv
    qg = q.transpose(1, 2).reshape(b, kv, g * t, dim)
    bias = bias.unsqueeze(2).expand(b, 1, g, t, t).reshape(b, 1, g * t, t)
    out = F.scaled_dot_product_attention(qg, k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias, scale=scale)
    return out.reshape(b, h, t, dim).transpose(1, 2).reshape(b, t, h * dim)


def sdpa_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, slots: int,
                scale: float) -> torch.Tensor:
    """q [B, h, D]; k/v caches [B*S, kv, D]; bias [B, 1, 1, S] (0 on used slots, -inf after) -> [B, h*D]."""
    b, h, dim = q.shape
    kv = k.shape[1]
    keys = k.view(b, slots, kv, dim).transpose(1, 2)
    values = v.view(b, slots, kv, dim).transpose(1, 2)
    out = F.scaled_dot_product_attention(q.view(b, kv, h // kv, dim), keys, values, attn_mask=bias, scale=scale)
    return out.reshape(b, h * dim)


def flash_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                 used: torch.Tensor, slots: int, scale: float) -> torch.Tensor:
    """q [B, h, D]; k/v caches [B*S, kv, D]; cu_q = [0..B], cu_k = [0, S, 2S, ..] and used [B] (int32)
    -> [B, h*D]. FlashAttention-2 varlen: row b attends to its first used[b] slots only."""
    out = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, 1, slots, 0.0, False, False, scale=scale,
                                                  seqused_k=used)[0]
    return out.reshape(q.shape[0], -1)


# --------------------------------------------------------------------------- the decoder


class _State:
    """Static device buffers for one (batch, prompt length, new tokens, sampling) shape."""

    def __init__(self, dec: StaticDecoder, batch: int, prompt_len: int, new_tokens: int, sp: SamplingParams):
        dev = dec.device
        self.key = (batch, prompt_len, new_tokens, sp)
        self.batch, self.prompt_len, self.new_tokens, self.sp = batch, prompt_len, new_tokens, sp
        self.slots = -(-(prompt_len + new_tokens) // 16) * 16
        d = dec.dims
        self.cache = torch.zeros(dec.n_layers, 2, batch * self.slots, d.kv_heads, d.head_dim, device=dev,
                                 dtype=dec.dtype)
        rows = torch.arange(batch, device=dev)
        self.row_base = rows * self.slots                                   # first cache row of each sequence
        self.cu_q = torch.arange(batch + 1, device=dev, dtype=torch.int32)
        self.cu_k = self.cu_q * self.slots
        self.slot_ids = torch.arange(self.slots, device=dev)
        self.slot = torch.zeros(batch, device=dev, dtype=torch.long)        # cache slot (= rotary position) of `cur`
        self.used = torch.zeros(batch, device=dev, dtype=torch.int32)       # slots attended to: slot + 1
        self.cur = torch.zeros(batch, device=dev, dtype=torch.long)         # token fed to the next step
        self.step = torch.zeros(1, device=dev, dtype=torch.long)            # its column in `out`; the noise step
        self.seed = torch.zeros(1, device=dev, dtype=torch.long)            # noise key of this generate call
        self.finished = torch.zeros(batch, device=dev, dtype=torch.bool)
        self.unresolved = torch.zeros(1, device=dev, dtype=torch.long)      # nucleus draws that fell back
        self.out = torch.zeros(batch, new_tokens, device=dev, dtype=torch.long)
        self.logp = torch.zeros(batch, new_tokens, device=dev, dtype=torch.float32)  # rollout log-probs of `out`
        self.graph: torch.cuda.CUDAGraph | None = None


class StaticDecoder:
    """Batched sampling with a static KV cache; on CUDA the decode step is one CUDA graph replay."""

    def __init__(self, model: nn.Module, pad_id: int, eos_id: int | None, use_graphs: bool | None = None,
                 compile: bool = False, attention: str = "auto"):
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(f"StaticDecoder does not support this model: {reason}")
        if attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention must be one of {ATTENTION_BACKENDS}, not {attention!r}")
        cfg = model.config
        self.model = model
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype
        self.pad_id, self.eos_id = pad_id, eos_id
        self.last_logprobs: torch.Tensor | None = None  # [B, R] of the last generate (`rollout_logprobs`)
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        self.dims = Dims(heads, getattr(cfg, "num_key_value_heads", None) or heads, head_dim, cfg.rms_norm_eps)
        self.scale = head_dim ** -0.5
        base = model.model
        self.n_layers = len(base.layers)
        self.layers = fused_layers(model)
        self.embed = base.embed_tokens.weight
        self.norm = base.norm.weight
        self.lm_head = model.lm_head.weight
        self.rotary = base.rotary_emb
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self.attention, self.attention_note = self._pick_attention(attention)
        self.compiled = False
        self._first: Callable = decode_qkv
        self._between: Callable = decode_between
        self._last: Callable = decode_last
        self._head: Callable = head_sample
        if compile:
            self.enable_compile()
        self._cos = self._sin = None
        self._state: _State | None = None

    # -- attention backend -------------------------------------------------------------------------
    def _pick_attention(self, want: str) -> tuple[str, str]:
        """('flash' or 'sdpa', why). flash is probed once against sdpa on random data of this model's shape."""
        if want == "sdpa":
            return "sdpa", "requested"
        why = None
        if self.device.type != "cuda":
            why = "not on CUDA"
        elif self.dtype not in (torch.bfloat16, torch.float16):
            why = f"{self.dtype} (flash needs bf16/fp16)"
        elif self.dims.head_dim % 8 or self.dims.head_dim > 256:
            why = f"head_dim {self.dims.head_dim}"
        else:
            why = self._probe_flash()
        if why is None:
            return "flash", "FlashAttention-2 varlen with seqused_k"
        if want == "flash":
            raise RuntimeError(f"flash attention unavailable: {why}")
        return "sdpa", f"flash unavailable: {why}"

    @torch.no_grad()
    def _probe_flash(self) -> str | None:
        """None when flash_decode agrees with sdpa_decode on random data (ragged lengths), else the reason."""
        d, dev = self.dims, self.device
        b, s = 3, 48
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(b, d.heads, d.head_dim, device=dev, generator=g).to(self.dtype)
        k = torch.randn(b * s, d.kv_heads, d.head_dim, device=dev, generator=g).to(self.dtype)
        v = torch.randn(b * s, d.kv_heads, d.head_dim, device=dev, generator=g).to(self.dtype)
        used = torch.tensor([5, 48, 17], device=dev, dtype=torch.int32)
        cu_q = torch.arange(b + 1, device=dev, dtype=torch.int32)
        bias = torch.where(torch.arange(s, device=dev)[None] < used[:, None], 0.0, float("-inf")).to(self.dtype)
        try:
            got = flash_decode(q, k, v, cu_q, cu_q * s, used, s, self.scale)
        except Exception as exc:  # no flash kernel in this build, or another signature
            return f"{type(exc).__name__}: {exc}"
        want = sdpa_decode(q, k, v, bias[:, None, None], s, self.scale)
        err = float((got.float() - want.float()).norm() / want.float().norm())
        return None if err < 2e-2 else f"disagrees with sdpa (relative error {err:.3g})"

    # -- compilation -------------------------------------------------------------------------------
    def enable_compile(self) -> None:
        """torch.compile the pure parts of the decode step (prefill stays eager)."""
        opts = dict(dynamic=False, fullgraph=True)
        self._first = torch.compile(decode_qkv, **opts)
        self._between = torch.compile(decode_between, **opts)
        self._last = torch.compile(decode_last, **opts)
        self._head = torch.compile(head_sample, **opts)
        self.compiled = True
        self._state = None  # recapture

    def disable_compile(self) -> None:
        self._first, self._between, self._last, self._head = decode_qkv, decode_between, decode_last, head_sample
        self.compiled = False
        self._state = None

    # -- rotary table ------------------------------------------------------------------------------
    def _rope_table(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [length, D] from the model's own rotary module (same numbers as its forward)."""
        if self._cos is None or self._cos.shape[0] < length:
            n = max(length, 256)
            dummy = torch.zeros(1, device=self.device, dtype=self.dtype)
            pos = torch.arange(n, device=self.device)[None]
            cos, sin = self.rotary(dummy, pos)
            self._cos, self._sin = cos[0].contiguous(), sin[0].contiguous()
        return self._cos, self._sin

    # -- forward pieces ----------------------------------------------------------------------------
    @torch.no_grad()
    def _prefill(self, st: _State, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Fill each row's cache slots 0..len-1 from its prompt; returns the last position's hidden state [B, H]."""
        b, p = input_ids.shape
        d = self.dims
        valid = attention_mask.bool()
        lens = valid.long().sum(-1)
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        cos_t, sin_t = self._rope_table(st.slots + 1)
        cos, sin = cos_t[positions][:, :, None], sin_t[positions][:, :, None]  # [B, P, 1, D]
        causal = torch.ones(p, p, device=self.device, dtype=torch.bool).tril()
        allowed = (causal[None] & valid[:, None, :]) | torch.eye(p, device=self.device, dtype=torch.bool)[None]
        bias = torch.zeros(b, 1, p, p, device=self.device, dtype=self.dtype)
        bias = bias.masked_fill(~allowed[:, None], float("-inf"))
        # slot s of row b takes prompt position s + (P - len_b): the padding is dropped, the prompt left-aligned
        src = (torch.arange(p, device=self.device)[None] + (p - lens)[:, None]).clamp(max=p - 1)
        src = src[:, :, None, None].expand(b, p, d.kv_heads, d.head_dim)
        h = F.embedding(input_ids, self.embed)
        for i, w in enumerate(self.layers):
            q, k, v = qkv_part(h, w, cos, sin, d)
            rows = st.cache[i].view(2, b, st.slots, d.kv_heads, d.head_dim)[:, :, :p]
            rows.copy_(torch.stack((k.gather(1, src), v.gather(1, src))))
            h = mlp_part(h, prefill_attention(q, k, v, bias, self.scale), w, d.eps)
        st.slot.copy_(lens)
        return h[:, -1].contiguous()  # the same layout as in the decode step (one compiled variant)

    def _attend(self, st: _State, q: torch.Tensor, layer_cache: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        if self.attention == "flash":
            return flash_decode(q, layer_cache[0], layer_cache[1], st.cu_q, st.cu_k, st.used, st.slots, self.scale)
        return sdpa_decode(q, layer_cache[0], layer_cache[1], bias, st.slots, self.scale)

    def _decode_step(self, st: _State) -> None:
        """One token for every sequence; reads and updates only `st`'s device buffers (graph-safe)."""
        d = self.dims
        slot = st.slot
        st.used.copy_(slot + 1)
        flat = st.row_base + slot                                            # [B] cache row of the new token
        bias = None
        if self.attention == "sdpa":
            bias = torch.where(st.slot_ids[None] <= slot[:, None], 0.0, float("-inf")).to(self.dtype)[:, None, None]
        h = F.embedding(st.cur, self.embed)                                  # [B, H]
        cos = self._cos.index_select(0, slot)[:, None, None]                 # [B, 1, 1, D]
        sin = self._sin.index_select(0, slot)[:, None, None]
        q, kv = self._first(h, self.layers[0], cos, sin, d)
        for i, w in enumerate(self.layers):
            st.cache[i].index_copy_(1, flat, kv)
            attn = self._attend(st, q, st.cache[i], bias)
            if i + 1 < self.n_layers:
                h, q, kv = self._between(h, attn, w, self.layers[i + 1], cos, sin, d)
            else:
                h = self._last(h, attn, w, d)
        self._sample_next(st, h)
        slot.add_(1)

    def _sample_next(self, st: _State, h: torch.Tensor) -> None:
        """Final norm, LM head and sampling of the next token from h [B, H] (the same function for the first
        token after the prefill and for every decode step), then emit it."""
        sp = st.sp
        nxt, unresolved, logp = self._head(h, self.norm, self.lm_head, st.seed, st.step, self.dims.eps, sp.greedy,
                                           sp.temperature, sp.top_p, sp.suppress_eos, self.eos_id)
        self._emit(st, nxt, unresolved, logp)

    def _emit(self, st: _State, nxt: torch.Tensor, unresolved: torch.Tensor | None, logp: torch.Tensor) -> None:
        st.logp.index_copy_(1, st.step, torch.where(st.finished, 0.0, logp.float())[:, None])
        nxt = torch.where(st.finished, torch.full_like(nxt, self.pad_id), nxt)
        st.out.index_copy_(1, st.step, nxt[:, None])
        if unresolved is not None:
            st.unresolved.add_((unresolved & ~st.finished).sum())
        if self.eos_id is not None:
            st.finished |= nxt == self.eos_id
        st.cur.copy_(nxt)
        st.step.add_(1)

    def _capture(self, st: _State) -> None:
        """Warm up (kernels, cuBLAS handles, compilation) on a side stream, then capture one decode step."""
        self._rope_table(st.slots + 1)

        def reset() -> None:
            st.slot.fill_(st.prompt_len)
            st.step.fill_(1)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                reset()
                self._decode_step(st)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        reset()
        with torch.cuda.graph(graph):
            self._decode_step(st)
        st.graph = graph

    # -- public ------------------------------------------------------------------------------------
    def state_for(self, batch: int, prompt_len: int, new_tokens: int, sp: SamplingParams) -> _State:
        key = (batch, prompt_len, new_tokens, sp)
        if self._state is None or self._state.key != key:
            self._state = None  # free the old buffers and graph first
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            st = _State(self, batch, prompt_len, new_tokens, sp)
            if self.use_graphs and new_tokens > 1:
                try:
                    with torch.no_grad():
                        self._capture(st)
                except Exception as exc:
                    if self.attention != "flash":
                        raise
                    # the probe passed eagerly, but the kernel would not capture: keep the graph, drop flash
                    log.warning("fast rollout: flash decode attention failed in CUDA-graph capture (%s: %s); "
                                "using sdpa", type(exc).__name__, exc)
                    self.attention, self.attention_note = "sdpa", f"flash failed in capture: {type(exc).__name__}"
                    st = _State(self, batch, prompt_len, new_tokens, sp)
                    with torch.no_grad():
                        self._capture(st)
            self._state = st
        return self._state

    @property
    def unresolved_draws(self) -> int:
        """Nucleus draws of the last generate call that no check resolved (they took the most likely token)."""
        return int(self._state.unresolved) if self._state is not None else 0

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 sp: SamplingParams = DEFAULT_SAMPLING, prompt_multiple: int = 16,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Left-padded prompts [B, P] -> responses [B, max_new_tokens], right-padded with `pad` after EOS.

        Prompts are left-padded further to a multiple of `prompt_multiple`, so that one captured graph
        serves prompts of similar lengths (extra padding is dropped; it does not change the result).
        The noise key is one draw from `generator` (a CPU one; default: torch's global generator, so
        torch.manual_seed(s) then generate gives the same tokens every time, as a generator seeded s does).
        """
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        input_ids = input_ids.to(self.device)
        attention_mask = attention_mask.to(self.device)
        b, p = input_ids.shape
        extra = (-p) % prompt_multiple
        if extra:
            input_ids = F.pad(input_ids, (extra, 0), value=self.pad_id)
            attention_mask = F.pad(attention_mask, (extra, 0), value=0)
            p += extra
        st = self.state_for(b, p, max_new_tokens, sp)
        st.finished.zero_()
        st.out.fill_(self.pad_id)
        st.logp.zero_()
        st.step.zero_()
        st.seed.fill_(seed)
        st.unresolved.zero_()
        self._sample_next(st, self._prefill(st, input_ids, attention_mask))
        check_every = 32
        for t in range(1, max_new_tokens):
            if st.graph is not None:
                st.graph.replay()
            else:
                self._decode_step(st)
            if self.eos_id is not None and not sp.suppress_eos and t % check_every == 0 and bool(st.finished.all()):
                break  # every sequence has ended: the rest of `out` is already pad
        self.last_logprobs = st.logp.clone()
        return st.out.clone()

"""Fast batched decoding for the `hf` engine: a static KV cache and a CUDA-graph-captured decode step.

`StaticDecoder` runs its own forward pass over the *parameters of a Hugging Face causal LM*
(Qwen2- and Llama-shaped models: RMSNorm, rotary attention with grouped KV heads, SwiGLU MLP). It
holds references to the HF model's parameter tensors, so the engine's `load_weights` (an in-place
`copy_` into those parameters) updates what the captured graphs read: graphs stay valid across
weight syncs.

One `generate` call:
    prefill   eager: the left-padded prompts [B, P] through every layer; K/V go to cache slots 0..P-1;
              the first token is sampled from the last position's logits
    decode    R-1 replays of one captured step: embed the current token, write its K/V at slot
              P+t, attend over the valid slots (prompt tokens and generated ones), sample the next
              token; every bit of state (slot, positions, finished flags, outputs) lives in device
              tensors that the step updates itself, so a replay needs no host work

The cache is [layers, B, kv_heads, P+R, head_dim]; the attention mask is an additive bias [B,1,1,S]
(0 on valid slots, -inf elsewhere) that the step extends by one slot per token. Sampling is
Gumbel-max (`argmax(logits/T - log(E))`, E ~ Exp(1)), an exact draw from softmax(logits/T), with
nucleus (top-p) filtering on sorted logits when top_p < 1. After EOS a sequence emits `pad`.
On CPU the same step runs eagerly (no graphs): that is what the CPU tests exercise.

With `compile=True` the per-layer pure parts of the decode step (norm, QKV projections, rotary;
output projection, norm, MLP) go through `torch.compile` (inductor fuses the elementwise work);
the compiled kernels are then captured in the same CUDA graph.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
SUPPORTED_ROPE = ("default", "linear", "llama3")


def unsupported_reason(model: nn.Module) -> Optional[str]:
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


# --------------------------------------------------------------------------- the functional forward


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF RMSNorm: normalise in float32, cast back, then scale."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on [B, heads, T, D] with cos/sin [B, 1, T, D] (rotate_half convention)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LayerWeights(NamedTuple):
    ln1: torch.Tensor
    wq: torch.Tensor
    bq: Optional[torch.Tensor]
    wk: torch.Tensor
    bk: Optional[torch.Tensor]
    wv: torch.Tensor
    bv: Optional[torch.Tensor]
    wo: torch.Tensor
    bo: Optional[torch.Tensor]
    ln2: torch.Tensor
    wg: torch.Tensor
    wu: torch.Tensor
    wd: torch.Tensor


def qkv_part(h: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, eps: float,
             heads: int, kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[B, T, H] -> q [B, heads, T, D], k and v [B, kv_heads, T, D] (rotary applied to q and k)."""
    b, t, _ = h.shape
    x = rms_norm(h, w.ln1, eps)
    q = F.linear(x, w.wq, w.bq).view(b, t, heads, head_dim).transpose(1, 2)
    k = F.linear(x, w.wk, w.bk).view(b, t, kv_heads, head_dim).transpose(1, 2)
    v = F.linear(x, w.wv, w.bv).view(b, t, kv_heads, head_dim).transpose(1, 2)
    return rotate(q, cos, sin), rotate(k, cos, sin), v


def mlp_part(h: torch.Tensor, attn: torch.Tensor, w: LayerWeights, eps: float) -> torch.Tensor:
    """Residual stream after the attention output projection and the SwiGLU MLP."""
    h = h + F.linear(attn, w.wo, w.bo)
    x = rms_norm(h, w.ln2, eps)
    return h + F.linear(F.silu(F.linear(x, w.wg)) * F.linear(x, w.wu), w.wd)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """Grouped-query attention without repeating K/V: q [B, h, T, D], k/v [B, kv, S, D], bias [B, 1, T, S]
    (additive) -> [B, T, h*D]. The h/kv query heads that share a KV head become extra query rows."""
    b, h, t, d = q.shape
    kv, s = k.shape[1], k.shape[2]
    g = h // kv
    qg = q.reshape(b, kv, g * t, d)
    if t > 1:
        bias = bias.unsqueeze(2).expand(b, 1, g, t, s).reshape(b, 1, g * t, s)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=bias, scale=scale)
    return out.reshape(b, h, t, d).transpose(1, 2).reshape(b, t, h * d)


# --------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class SamplingParams:
    greedy: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    suppress_eos: bool = False  # fixed-length responses: EOS can never be drawn


def sample(logits: torch.Tensor, sp: SamplingParams, eos_id: Optional[int]) -> torch.Tensor:
    """Next tokens [B] from logits [B, V]; fixed shapes and no host sync (safe inside a CUDA graph)."""
    x = logits.float()
    if sp.suppress_eos and eos_id is not None:
        x[:, eos_id] = float("-inf")
    if sp.greedy:
        return x.argmax(-1)
    if sp.temperature != 1.0:
        x = x / sp.temperature
    if sp.top_p < 1.0:
        sorted_x, order = x.sort(dim=-1, descending=True)
        probs = sorted_x.softmax(-1)
        mass_before = probs.cumsum(-1) - probs
        sorted_x = sorted_x.masked_fill(mass_before > sp.top_p, float("-inf"))
        noise = torch.empty_like(sorted_x).exponential_().log_()
        pick = (sorted_x - noise).argmax(-1, keepdim=True)
        return order.gather(-1, pick).squeeze(-1)
    noise = torch.empty_like(x).exponential_().log_()
    return (x - noise).argmax(-1)


# --------------------------------------------------------------------------- the decoder


class _State:
    """Static device buffers for one (batch, prompt length, new tokens, sampling) shape."""

    def __init__(self, dec: "StaticDecoder", batch: int, prompt_len: int, new_tokens: int, sp: SamplingParams):
        dev, dt = dec.device, dec.dtype
        self.key = (batch, prompt_len, new_tokens, sp)
        self.batch, self.prompt_len, self.new_tokens, self.sp = batch, prompt_len, new_tokens, sp
        self.slots = -(-(prompt_len + new_tokens) // 16) * 16  # a multiple of 16: aligned attention bias rows
        shape = (dec.n_layers, batch, dec.kv_heads, self.slots, dec.head_dim)
        self.k_cache = torch.zeros(shape, device=dev, dtype=dt)
        self.v_cache = torch.zeros(shape, device=dev, dtype=dt)
        self.bias = torch.full((batch, 1, 1, self.slots), float("-inf"), device=dev, dtype=dt)
        self.cur = torch.zeros(batch, device=dev, dtype=torch.long)        # token fed to the next step
        self.pos = torch.zeros(batch, device=dev, dtype=torch.long)        # its rotary position
        self.slot = torch.zeros(1, device=dev, dtype=torch.long)           # its cache slot
        self.step = torch.zeros(1, device=dev, dtype=torch.long)           # its column in `out`
        self.finished = torch.zeros(batch, device=dev, dtype=torch.bool)
        self.out = torch.zeros(batch, new_tokens, device=dev, dtype=torch.long)
        self.graph: Optional[torch.cuda.CUDAGraph] = None


class StaticDecoder:
    """Batched sampling with a static KV cache; on CUDA the decode step is one CUDA graph replay."""

    def __init__(self, model: nn.Module, pad_id: int, eos_id: Optional[int], use_graphs: Optional[bool] = None,
                 compile: bool = False):
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(f"StaticDecoder does not support this model: {reason}")
        cfg = model.config
        self.model = model
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype
        self.pad_id, self.eos_id = pad_id, eos_id
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.scale = self.head_dim ** -0.5
        self.eps = cfg.rms_norm_eps
        base = model.model
        self.n_layers = len(base.layers)
        self.layers = [self._layer_weights(layer) for layer in base.layers]
        self.embed = base.embed_tokens.weight
        self.norm = base.norm.weight
        self.lm_head = model.lm_head.weight
        self.rotary = base.rotary_emb
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self._qkv: Callable = qkv_part
        self._mlp: Callable = mlp_part
        self.compiled = False
        if compile:
            self.enable_compile()
        self._cos = self._sin = None
        self._state: Optional[_State] = None

    @staticmethod
    def _layer_weights(layer: nn.Module) -> LayerWeights:
        a, m = layer.self_attn, layer.mlp
        return LayerWeights(layer.input_layernorm.weight, a.q_proj.weight, a.q_proj.bias, a.k_proj.weight, a.k_proj.bias,
                            a.v_proj.weight, a.v_proj.bias, a.o_proj.weight, a.o_proj.bias,
                            layer.post_attention_layernorm.weight, m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight)

    def enable_compile(self) -> None:
        """torch.compile the per-layer pure functions used by the decode step (prefill stays eager)."""
        self._qkv = torch.compile(qkv_part, dynamic=False, fullgraph=True)
        self._mlp = torch.compile(mlp_part, dynamic=False, fullgraph=True)
        self.compiled = True
        self._state = None  # recapture

    def disable_compile(self) -> None:
        self._qkv, self._mlp, self.compiled = qkv_part, mlp_part, False
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
    def _logits_last(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(rms_norm(h, self.norm, self.eps), self.lm_head)

    @torch.no_grad()
    def _prefill(self, st: _State, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Fill cache slots 0..P-1 from the prompts; returns the logits of the last prompt position [B, V]."""
        b, p = input_ids.shape
        valid = attention_mask.bool()
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        cos_t, sin_t = self._rope_table(st.slots + 1)
        cos, sin = cos_t[positions][:, None], sin_t[positions][:, None]  # [B, 1, P, D]
        causal = torch.ones(p, p, device=self.device, dtype=torch.bool).tril()
        allowed = (causal[None] & valid[:, None, :]) | torch.eye(p, device=self.device, dtype=torch.bool)[None]
        bias = torch.zeros(b, 1, p, p, device=self.device, dtype=self.dtype).masked_fill(~allowed[:, None], float("-inf"))
        h = F.embedding(input_ids, self.embed)
        for i, w in enumerate(self.layers):
            q, k, v = qkv_part(h, w, cos, sin, self.eps, self.heads, self.kv_heads, self.head_dim)
            st.k_cache[i, :, :, :p].copy_(k)
            st.v_cache[i, :, :, :p].copy_(v)
            h = mlp_part(h, attend(q, k, v, bias, self.scale), w, self.eps)
        st.bias.fill_(float("-inf"))
        st.bias[:, 0, 0, :p].masked_fill_(valid, 0.0)
        st.pos.copy_(valid.long().sum(-1))
        return self._logits_last(h[:, -1])

    def _decode_step(self, st: _State) -> None:
        """One token for every sequence; reads and updates only `st`'s device buffers (graph-safe)."""
        cos_t, sin_t = self._cos, self._sin
        st.bias.index_fill_(3, st.slot, 0.0)
        h = F.embedding(st.cur, self.embed)[:, None]                        # [B, 1, H]
        cos = cos_t.index_select(0, st.pos)[:, None, None]                  # [B, 1, 1, D]
        sin = sin_t.index_select(0, st.pos)[:, None, None]
        for i, w in enumerate(self.layers):
            q, k, v = self._qkv(h, w, cos, sin, self.eps, self.heads, self.kv_heads, self.head_dim)
            kc, vc = st.k_cache[i], st.v_cache[i]
            kc.index_copy_(2, st.slot, k)
            vc.index_copy_(2, st.slot, v)
            h = self._mlp(h, attend(q, kc, vc, st.bias, self.scale), w, self.eps)
        nxt = sample(self._logits_last(h[:, 0]), st.sp, self.eos_id)
        self._emit(st, nxt)
        st.pos.add_(1)
        st.slot.add_(1)

    def _emit(self, st: _State, nxt: torch.Tensor) -> None:
        nxt = torch.where(st.finished, torch.full_like(nxt, self.pad_id), nxt)
        st.out.index_copy_(1, st.step, nxt[:, None])
        if self.eos_id is not None:
            st.finished |= nxt == self.eos_id
        st.cur.copy_(nxt)
        st.step.add_(1)

    def _capture(self, st: _State) -> None:
        """Warm up (kernels, cuBLAS handles, compilation) on a side stream, then capture one decode step."""
        self._rope_table(st.slots + 1)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                st.slot.fill_(st.prompt_len)
                st.step.fill_(1)
                self._decode_step(st)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        st.slot.fill_(st.prompt_len)
        st.step.fill_(1)
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
                # the warm-up steps draw random numbers: leave the caller's (seeded) RNG state as it was
                with torch.no_grad(), torch.random.fork_rng(devices=[self.device]):
                    self._capture(st)
            self._state = st
        return self._state

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 sp: SamplingParams = SamplingParams(), prompt_multiple: int = 16) -> torch.Tensor:
        """Left-padded prompts [B, P] -> responses [B, max_new_tokens], right-padded with `pad` after EOS.

        Prompts are left-padded further to a multiple of `prompt_multiple`, so that one captured graph
        serves prompts of similar lengths (extra padding is masked; it does not change the result).
        """
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
        st.slot.fill_(p)
        st.step.zero_()
        logits = self._prefill(st, input_ids, attention_mask)
        self._emit(st, sample(logits, sp, self.eos_id))
        check_every = 32
        for t in range(1, max_new_tokens):
            if st.graph is not None:
                st.graph.replay()
            else:
                self._decode_step(st)
            if self.eos_id is not None and not sp.suppress_eos and t % check_every == 0 and bool(st.finished.all()):
                break  # every sequence has ended: the rest of `out` is already pad
        return st.out.clone()

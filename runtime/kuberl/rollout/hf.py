"""`hf` rollout: an unsharded copy of the policy, synced from the actor every step.

Two paths over the same Hugging Face model object:
- `generate`: transformers `model.generate` (the default, and the CPU quickstart's path);
- fast (`spec.rollout.compile: true` on CUDA): `StaticDecoder` — a static KV cache, the decode step
  captured in a CUDA graph, its per-layer pure parts fused by `torch.compile`. Models it cannot run
  (see `fast.unsupported_reason`) fall back to `generate`, with the reason in `self.fallback_reason`.

Weight sync copies into the model's parameters in place, so the fast path's captured graphs (which
read those very tensors) stay valid.
"""

from __future__ import annotations

import logging

import torch

from ..models import load_causal_lm
from ..spec import JobSpec
from .fast import SamplingParams, StaticDecoder, unsupported_reason

log = logging.getLogger(__name__)


class HFRollout:
    def __init__(self, spec: JobSpec, device: torch.device, dtype: torch.dtype, tokenizer,
                 fast: bool | None = None, inductor: bool | None = None):
        """`fast`/`inductor` override the spec (tests, benchmarks): fast=None means
        `spec.rollout.compile and device is CUDA`; inductor=None means "when fast"."""
        self.spec, self.device, self.tok = spec, device, tokenizer
        # Built on the target device: the actor overwrites these weights with its own at setup.
        self.model = load_causal_lm(spec.model, dtype=dtype, seed=spec.trainer.seed, device=device).to(device).eval()
        self.model.requires_grad_(False)
        self.model.generation_config.pad_token_id = tokenizer.pad_token_id
        want_fast = (spec.rollout.compile and device.type == "cuda") if fast is None else fast
        self.fallback_reason: str | None = None
        self.fast: StaticDecoder | None = None
        if want_fast:
            self.fallback_reason = unsupported_reason(self.model)
            if self.fallback_reason:
                log.warning("hf rollout: fast path unavailable (%s); using transformers generate", self.fallback_reason)
            else:
                use_inductor = want_fast if inductor is None else inductor
                self.fast = StaticDecoder(self.model, tokenizer.pad_token_id, tokenizer.eos_token_id,
                                          compile=bool(use_inductor and device.type == "cuda"))

    @property
    def path(self) -> str:
        """Which generation path runs: 'generate', 'static-graphs', 'static-graphs+inductor' or 'static-eager'."""
        if self.fast is None:
            return "generate"
        if not self.fast.use_graphs:
            return "static-eager"
        return "static-graphs+inductor" if self.fast.compiled else "static-graphs"

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """In-place copies into the existing parameters (captured graphs keep pointing at them)."""
        params = dict(self.model.named_parameters())
        for name, value in state_dict.items():
            if name in params:
                params[name].copy_(value.to(params[name].dtype), non_blocking=True)

    def sampling(self, greedy: bool = False) -> SamplingParams:
        r = self.spec.rollout
        return SamplingParams(greedy=greedy, temperature=r.temperature, top_p=r.top_p, suppress_eos=r.fixed_length)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, seed: int,
                 greedy: bool = False) -> torch.Tensor:
        r = self.spec.rollout
        torch.manual_seed(seed)
        if self.fast is not None:
            try:
                return self.fast.generate(input_ids, attention_mask, r.max_new_tokens, self.sampling(greedy))
            except Exception as exc:  # inductor/Triton problems on an unusual setup: keep the graphs, drop compile
                if not self.fast.compiled:
                    raise
                log.warning("hf rollout: torch.compile of the decode step failed (%s: %s); "
                            "using CUDA graphs without it",
                            type(exc).__name__, exc)
                self.fast.disable_compile()
                torch.manual_seed(seed)
                return self.fast.generate(input_ids, attention_mask, r.max_new_tokens, self.sampling(greedy))
        sampling = {} if greedy else {"temperature": r.temperature, "top_p": r.top_p, "top_k": 0}
        out = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            do_sample=not greedy,
            **sampling,
            max_new_tokens=r.max_new_tokens,
            min_new_tokens=r.max_new_tokens if r.fixed_length else 0,
            pad_token_id=self.tok.pad_token_id,
            eos_token_id=self.tok.eos_token_id,
        )
        resp = out[:, input_ids.shape[1] :]
        if resp.shape[1] < r.max_new_tokens:
            pad = resp.new_full((resp.shape[0], r.max_new_tokens - resp.shape[1]), self.tok.pad_token_id)
            resp = torch.cat([resp, pad], dim=1)
        return resp

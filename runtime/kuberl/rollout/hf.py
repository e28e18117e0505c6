"""`hf` rollout: an unsharded copy of the policy, synced from the actor every step.

Two paths over the same Hugging Face model object:
- `generate`: transformers `model.generate` (the default, and the CPU quickstart's path);
- fast (`spec.rollout.compile: true` on CUDA): `StaticDecoder` — a static KV cache, the decode step
  captured in a CUDA graph, its per-layer pure parts fused by `torch.compile`. Models it cannot run
  (see `fast.unsupported_reason`) fall back to `generate`, with the reason in `self.fallback_reason`.
Evaluation's `greedy_answers` takes transformers `generate` on both.

Weight sync copies into the model's parameters in place, so the fast path's captured graphs (which
read those very tensors) stay valid.

Randomness: each `generate` call draws from a `torch.Generator` of its own, seeded by the call's seed,
never from torch's global generator. Under spec.rollout.asynchronous this call runs on a second thread
of the actor's process beside `update`, and the global generator is one per process: seeding it here
would reseed it under the update, and a draw there would shift this call's samples. Tokens are the same
as `torch.manual_seed(seed)` then transformers' sampling: `OwnDraw` applies the same warpers
(temperature, top-p: transformers' own classes, in generate's order) and the same
`multinomial(softmax(scores))`, only from the call's generator, then leaves generate a one-hot choice
that its greedy path takes (tests/unit/test_fast_rollout.py checks both).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import LogitsProcessor, TemperatureLogitsWarper, TopPLogitsWarper

from kuberl.spec import JobSpec
from kuberl.training.models import load_causal_lm
from kuberl.training.sequence import response_mask

from .fast import SamplingParams, StaticDecoder, unsupported_reason
from .sampling import rollout_logprobs

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
        self._logprobs: torch.Tensor | None = None
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
                 greedy: bool = False, every_token: Callable[[], None] | None = None) -> torch.Tensor:
        """Left-padded prompts [B, P] -> responses [B, max_new_tokens]; torch's global RNG is not touched.
        `every_token` (transformers generate only): called after each decode step's draw, before the next step's
        forward (spec.rollout.async tags each token's version there, and may swap the weights)."""
        r = self.spec.rollout
        self._logprobs = None
        if every_token is not None and self.fast is not None:
            raise ValueError("every_token needs the transformers generate path (hf rollout without compile)")
        if self.fast is not None:
            out = self._fast_generate(input_ids, attention_mask, seed, greedy)
            self._logprobs = self.fast.last_logprobs  # on the device: the actor masks it there, no round trip
            return out
        draw = [] if greedy else [OwnDraw(r.temperature, r.top_p, torch.Generator(self.device).manual_seed(seed))]
        after = [EveryToken(every_token)] if every_token is not None else []
        out = self._transformers_generate(input_ids, attention_mask, [*draw, *after],
                                          r.max_new_tokens if r.fixed_length else 0)
        if draw:  # generate draws for the rows that have ended too: theirs are left out
            steps = torch.stack(draw[0].logprobs, dim=1).cpu() if draw[0].logprobs else torch.zeros(len(out), 0)
            ended = response_mask(out.cpu(), None if r.fixed_length else self.tok.eos_token_id)
            self._logprobs = F.pad(steps, (0, out.shape[1] - steps.shape[1])) * ended
        return out

    def rollout_logprobs(self) -> torch.Tensor | None:
        """[B, R] float32 (the fast path's on its device, else on the CPU): the last `generate`'s log-prob of each
        drawn token under the distribution it was drawn from (`kuberl.rollout.sampling.rollout_logprobs`); None
        after a greedy transformers generate."""
        return self._logprobs

    def turns(self) -> contextlib.AbstractContextManager[None]:
        """Nothing to keep awake: this engine never sleeps."""
        return contextlib.nullcontext()

    @torch.no_grad()
    def greedy_answers(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Left-padded prompts [B, P] -> greedy responses [B, max_new_tokens] up to EOS (even under fixedLength),
        through transformers generate on either path: the fast decoder's kernels round differently, and
        evaluation keeps decoding as it always has."""
        return self._transformers_generate(input_ids, attention_mask, [], 0)

    def behaviour_model(self) -> torch.nn.Module:
        """The engine's own copy of the policy (synced after each update)."""
        return self.model

    def resident_modules(self) -> list[torch.nn.Module]:
        """The model, unless the fast path's CUDA graphs captured its buffers (moving it would leave them behind)."""
        return [self.model] if self.fast is None else []

    def _fast_generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, seed: int,
                       greedy: bool) -> torch.Tensor:
        """`StaticDecoder`; a failing torch.compile of its decode step falls back to its graphs without it."""
        r = self.spec.rollout
        try:
            return self.fast.generate(input_ids, attention_mask, r.max_new_tokens, self.sampling(greedy),
                                      generator=torch.Generator().manual_seed(seed))
        except Exception as exc:  # inductor/Triton problems on an unusual setup: keep the graphs, drop compile
            if not self.fast.compiled:
                raise
            log.warning("hf rollout: torch.compile of the decode step failed (%s: %s); "
                        "using CUDA graphs without it",
                        type(exc).__name__, exc)
            self.fast.disable_compile()
            return self.fast.generate(input_ids, attention_mask, r.max_new_tokens, self.sampling(greedy),
                                      generator=torch.Generator().manual_seed(seed))

    def _transformers_generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                               draw: list[LogitsProcessor], min_new_tokens: int) -> torch.Tensor:
        """transformers `generate` (its greedy path, taking the one token `draw` leaves when it samples):
        prompts [B, P] -> responses [B, max_new_tokens], right-padded with pad after an EOS."""
        r = self.spec.rollout
        out = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            do_sample=False,  # a draw is OwnDraw's; generate takes the one token it leaves
            logits_processor=draw,
            max_new_tokens=r.max_new_tokens,
            min_new_tokens=min_new_tokens,
            pad_token_id=self.tok.pad_token_id,
            eos_token_id=self.tok.eos_token_id,
        )
        resp = out[:, input_ids.shape[1] :]
        if resp.shape[1] < r.max_new_tokens:
            pad = resp.new_full((resp.shape[0], r.max_new_tokens - resp.shape[1]), self.tok.pad_token_id)
            resp = torch.cat([resp, pad], dim=1)
        return resp


class OwnDraw(LogitsProcessor):
    """Sampling from a generator of its own, as a logits processor (the last one): scores [B, V] -> 0 at one
    token per row drawn from softmax(top_p(scores / temperature)), -inf elsewhere."""

    def __init__(self, temperature: float, top_p: float, generator: torch.Generator):
        self.warpers = ([TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []) + \
            ([TopPLogitsWarper(top_p)] if top_p < 1.0 else [])
        self.generator = generator
        self.temperature = temperature
        self.logprobs: list[torch.Tensor] = []  # [B] per step: the drawn token's rollout log-prob

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        raw = scores
        for warp in self.warpers:
            scores = warp(input_ids, scores)
        token = torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=self.generator)  # [B, 1]
        # generate's own processors ran before this one: a min_new_tokens EOS ban is in `raw` already
        self.logprobs.append(rollout_logprobs(raw, token[:, 0], self.temperature))
        return torch.full_like(scores, -math.inf).scatter_(1, token, 0.0)


class EveryToken(LogitsProcessor):
    """A callback once per decode step, after that step's token is drawn (the last processor); scores pass."""

    def __init__(self, fn: Callable[[], None]):
        self.fn = fn

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.fn()
        return scores

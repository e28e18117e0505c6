"""`hf` rollout: transformers `generate` on an unsharded copy of the policy, synced from the actor."""

from __future__ import annotations

import torch

from ..models import load_causal_lm
from ..spec import JobSpec


class HFRollout:
    def __init__(self, spec: JobSpec, device: torch.device, dtype: torch.dtype, tokenizer):
        self.spec, self.device, self.tok = spec, device, tokenizer
        self.model = load_causal_lm(spec.model, dtype=dtype, seed=spec.trainer.seed).to(device).eval()
        self.model.generation_config.pad_token_id = tokenizer.pad_token_id

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        params = dict(self.model.named_parameters())
        for name, value in state_dict.items():
            if name in params:
                params[name].copy_(value.to(params[name].dtype))

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, seed: int) -> torch.Tensor:
        r = self.spec.rollout
        torch.manual_seed(seed)
        out = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            do_sample=True,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=0,
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

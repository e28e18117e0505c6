"""Reward: a rule function by import path, or a reward model with a sequence-classification head."""

from __future__ import annotations

import torch

from .. import dist as kdist
from ..batch import Batch
from ..models import load_reward_model, load_tokenizer
from ..rewards import load_reward_fn
from .base import Worker


class RewardWorker(Worker):
    role = "reward"

    def setup(self) -> None:
        cfg = self.spec.reward
        self.fn = load_reward_fn(cfg.function) if cfg.function else None
        self.model = None
        if cfg.model is not None and cfg.model.is_set():
            self.rm_tokenizer = load_tokenizer(cfg.model)
            model = load_reward_model(cfg.model)
            model.requires_grad_(False)
            self.model = kdist.shard(model, self.device, self.dtype).eval()

    @torch.no_grad()
    def compute_scores(self, batch: Batch) -> Batch:
        """scores [B] (float32): one scalar per sequence."""
        texts = self.decode(batch["responses"], batch["response_mask"])
        if self.fn is not None:
            m = batch.meta
            scores = [self.fn.score(*sample) for sample in zip(m["prompt"], texts, m["answer"], m["row"], m["origin"])]
            return Batch({"scores": torch.tensor(scores, dtype=torch.float32)})
        enc = self.rm_tokenizer([p + r for p, r in zip(batch.meta["prompt"], texts)], return_tensors="pt", padding=True)
        parts = []
        for i in range(0, len(texts), self.spec.trainer.micro_batch_size):
            ids = enc["input_ids"][i : i + self.spec.trainer.micro_batch_size].to(self.device)
            mask = enc["attention_mask"][i : i + self.spec.trainer.micro_batch_size].to(self.device)
            parts.append(self.model(input_ids=ids, attention_mask=mask).logits[:, 0].float())
        return Batch({"scores": torch.cat(parts).cpu()})

    def decode(self, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
        """Response text up to (not including) EOS."""
        eos = self.tokenizer.eos_token_id
        kept = [[t for t, keep in zip(ids, m) if keep and t != eos] for ids, m in zip(responses.tolist(), mask.tolist())]
        return self.tokenizer.batch_decode(kept, skip_special_tokens=True)

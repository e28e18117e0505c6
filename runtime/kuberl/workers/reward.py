"""Reward: a rule function by import path, or a reward model with a sequence-classification head."""

from __future__ import annotations

import torch

from kuberl.data.batch import Batch
from kuberl.rewards import load_reward_fn
from kuberl.training import dist as kdist
from kuberl.training.models import load_reward_model, load_tokenizer
from kuberl.training.sequence import decode_responses
from kuberl.workers.dispatch import Dispatch, register

from .base import Worker


class RewardWorker(Worker):
    def setup(self) -> None:
        cfg = self.spec.reward
        self.fn = load_reward_fn(cfg.function) if cfg.function else None
        self.model = None
        if cfg.model is not None and cfg.model.is_set():
            self.rm_tokenizer = load_tokenizer(cfg.model)
            model = load_reward_model(cfg.model)
            model.requires_grad_(False)
            self.model = kdist.shard(model, self.device, self.dtype, compile_blocks=self.kernels.compile_blocks).eval()

    def resident_modules(self) -> list[torch.nn.Module]:
        return [self.model] if self.model is not None else []

    @register(Dispatch.SPLIT, repeatable=True)
    @torch.no_grad()
    def compute_scores(self, batch: Batch) -> Batch:
        """scores [B] (float32): one scalar per sequence."""
        texts = decode_responses(self.tokenizer, batch["responses"], batch["response_mask"])
        if self.fn is not None:
            m, n = batch.meta, len(texts)  # a program of one's own may send only prompt and answer
            rows, origins = m.get("row") or [{}] * n, m.get("origin") or ["(sample)"] * n
            scores = [self.fn.score(*sample) for sample in zip(m["prompt"], texts, m["answer"], rows, origins)]
            return Batch({"scores": torch.tensor(scores, dtype=torch.float32)})
        enc = self.rm_tokenizer([p + r for p, r in zip(batch.meta["prompt"], texts)], return_tensors="pt", padding=True)
        parts = []
        for i in range(0, len(texts), self.spec.trainer.micro_batch_size):
            ids = enc["input_ids"][i : i + self.spec.trainer.micro_batch_size].to(self.device)
            mask = enc["attention_mask"][i : i + self.spec.trainer.micro_batch_size].to(self.device)
            parts.append(self.model(input_ids=ids, attention_mask=mask).logits[:, 0].float())
        return Batch({"scores": torch.cat(parts).cpu()})

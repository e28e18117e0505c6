"""Critic: an FSDP2 value model trained with the clipped value loss."""

from __future__ import annotations

import torch

from .. import algos
from ..batch import Batch
from ..dispatch import Dispatch, register
from ..models import load_value_model
from ..sequence import response_values
from .base import Worker
from .train import FSDPTrainer


class CriticWorker(Worker):
    def setup(self) -> None:
        tr = self.spec.trainer
        model = load_value_model(self.spec.model, seed=tr.seed)
        self.trainer = FSDPTrainer(model, self.device, self.dtype, tr.critic_lr, tr.weight_decay, tr.grad_clip,
                                   tr.warmup_steps, self.kernels, self.role_spec.offload,
                                   self.role_spec.lora, head=("head",), seed=tr.seed)

    @register(Dispatch.SPLIT, repeatable=True)
    @torch.no_grad()
    def compute_values(self, batch: Batch) -> Batch:
        """values [B, R]: V(state before each response token)."""
        parts = [response_values(self.trainer.model, mb["input_ids"], mb["attention_mask"], mb["responses"].shape[1])
                 for mb in batch.minibatches(self.spec.trainer.micro_batch_size)]
        return Batch({"values": torch.cat(parts).cpu()})

    @register(Dispatch.SPLIT, trains=True, repeatable=True)  # applied once per step (FSDPTrainer.fit)
    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """Value-loss epochs over the batch; returns token-averaged stats from all ranks."""
        spec = self.spec

        def loss_fn(mb: Batch):
            mask, n = mb["response_mask"], mb["response_mask"].sum()
            v = response_values(self.trainer.model, mb["input_ids"], mb["attention_mask"], mb["responses"].shape[1])
            loss, info = algos.value_loss(v, mb["values"], mb["returns"], mask, spec.algorithm.value_clip)
            return loss * n, {"vf_loss": loss.detach() * n, "vf_clip_frac": info["vf_clip_frac"] * n}

        stats = self.trainer.fit(batch, step, spec.trainer, loss_fn)
        stats["critic_grad_norm"] = stats.pop("grad_norm")
        return stats

"""Critic: an FSDP2 value model trained with the clipped value loss."""

from __future__ import annotations

import torch

from kuberl import algos
from kuberl.data.batch import Batch
from kuberl.training.micro import map_rows
from kuberl.training.models import load_value_model
from kuberl.training.packing import use_varlen
from kuberl.training.sequence import response_values
from kuberl.training.trainer import FSDPTrainer
from kuberl.workers.dispatch import Dispatch, register

from .base import Worker


class CriticWorker(Worker):
    def setup(self) -> None:
        model = load_value_model(self.spec.model, seed=self.spec.trainer.seed)
        if self.spec.trainer.packed:
            use_varlen(model.trunk)
        self.trainer = FSDPTrainer.for_role(self, model, head=("head",))

    @register(Dispatch.SPLIT, repeatable=True)
    @torch.no_grad()
    def compute_values(self, batch: Batch) -> Batch:
        """values [B, R]: V(state before each response token)."""
        return Batch({"values": map_rows(batch, self.micro_batches(batch), self._values).cpu()})

    def _values(self, mb: Batch) -> torch.Tensor:
        """[B, R] of a micro-batch, packed under spec.trainer.packed (0 then where its response mask is 0)."""
        return response_values(self.trainer.model, mb["input_ids"], mb["attention_mask"], mb["responses"].shape[1],
                               mb["response_mask"] if self.spec.trainer.packed else None)

    @register(Dispatch.SPLIT, trains=True, repeatable=True)  # applied once per step (FSDPTrainer.fit)
    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """Value-loss epochs over the batch; returns token-averaged stats from all ranks."""
        spec = self.spec

        def loss_fn(mb: Batch):  # token-mean: each token's weight is 1 / the mini-batch's tokens
            n, w = mb["response_mask"].sum(), mb["loss_weight"]
            v = self._values(mb)
            loss, info = algos.value_loss(v, mb["values"], mb["returns"], w, spec.algorithm.value_clip)
            return loss * w.sum(), {"vf_loss": loss.detach() * n, "vf_clip_frac": info["vf_clip_frac"] * n}

        stats = self.trainer.fit(batch, step, spec.trainer, loss_fn)
        stats["critic_grad_norm"] = stats.pop("grad_norm")
        return stats

"""Reference policy: frozen weights from the model path, log-probs only."""

from __future__ import annotations

import torch

from kuberl.data.batch import Batch
from kuberl.training import dist as kdist
from kuberl.training.micro import map_rows
from kuberl.training.models import load_causal_lm
from kuberl.training.packing import use_varlen
from kuberl.training.sequence import response_logprobs
from kuberl.workers.dispatch import Dispatch, register

from .base import Worker


class RefWorker(Worker):
    def setup(self) -> None:
        model = load_causal_lm(self.spec.model, seed=self.spec.trainer.seed)
        model.requires_grad_(False)
        if self.spec.trainer.packed:
            use_varlen(model)
        self.model = kdist.shard(model, self.device, self.dtype, compile_blocks=self.kernels.compile_blocks).eval()

    def resident_modules(self) -> list[torch.nn.Module]:
        return [self.model]

    @register(Dispatch.SPLIT, repeatable=True)
    @torch.no_grad()
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        """ref_logprobs [B, R]."""
        k, packed = self.kernels, self.spec.trainer.packed

        def logprobs(mb: Batch) -> torch.Tensor:
            return response_logprobs(self.model, mb["input_ids"], mb["attention_mask"], mb["responses"],
                                     self.spec.rollout.temperature, chunk_size=k.chunk_rows, fused=k.fused_head,
                                     compile=k.compile_head, response_mask=mb["response_mask"] if packed else None)[0]

        return Batch({"ref_logprobs": map_rows(batch, self.micro_batches(batch), logprobs).cpu()})

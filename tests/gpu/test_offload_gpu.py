"""Optimizer-only offload on a CUDA device: the AdamW moments stay in pinned host memory, as DTensors
placed like their parameters, and the GPU holds that much less. (On CPU every tensor is in host memory,
so tests/integration/test_offload.py cannot show where the moments live.)
Run: `pytest -m gpu tests/gpu -s` on a machine with a GPU (skipped elsewhere).
"""

from __future__ import annotations

import gc

import pytest
import torch
from torch.distributed.tensor import DTensor

from kuberl.groups import LocalWorkerGroup
from kuberl.proxies import ActorProxy

from ..integration.conftest import load_example
from ..integration.test_offload import OVERRIDES, train_batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def after_two_updates(offload: dict) -> tuple[int, list[torch.Tensor], float]:
    """(GPU bytes allocated after two actor updates, the actor's AdamW moments, the last loss)."""
    spec = load_example("quickstart.yaml", **OVERRIDES, **{"roles.actor.gpus": 1, "roles.actor.offload": offload}).spec
    group = LocalWorkerGroup("actor", spec, "cuda")
    group.start()
    try:
        actor = ActorProxy(group)
        batch = train_batch(spec, actor)
        keys = ("input_ids", "attention_mask", "responses", "response_mask", "old_logprobs", "advantages")
        stats = [actor.update(batch.select(*keys), step=s) for s in range(2)]
        torch.cuda.synchronize()
        state = group.worker.trainer.optimizer.optimizer.state.values()
        moments = [st[k] for st in state for k in ("exp_avg", "exp_avg_sq")]
        return torch.cuda.memory_allocated(), moments, stats[-1]["pg_loss"]
    finally:
        group.shutdown()
        gc.collect()
        torch.cuda.empty_cache()


def test_optimizer_offload_keeps_the_moments_off_the_gpu():
    on_gpu, moments_gpu, _ = after_two_updates({})
    offloaded, moments, loss = after_two_updates({"optimizer": True})
    assert moments and all(isinstance(m, DTensor) for m in moments)
    assert all(m._local_tensor.device.type == "cpu" and m._local_tensor.is_pinned() for m in moments)
    moment_bytes = sum(m._local_tensor.numel() * m._local_tensor.element_size() for m in moments_gpu)
    assert on_gpu - offloaded >= 0.9 * moment_bytes, (on_gpu, offloaded, moment_bytes)
    assert loss == loss  # the update ran (not NaN)

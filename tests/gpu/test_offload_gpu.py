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

from kuberl.controller.proxies import ActorProxy
from kuberl.workers.groups import LocalWorkerGroup

from ..integration.conftest import load_example
from ..integration.test_offload import OVERRIDES, train_batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def after_two_updates(offload: dict, model: str = "tiny") -> tuple[int, int, bool, float]:
    """(GPU bytes the actor's group added over two updates, measured from before it started, its AdamW moments'
    bytes, whether every moment is a DTensor with its shard in pinned host memory, the last loss). No tensor
    outlives the call: before, the GPU run's moments were returned and so still held while the offloaded run
    was measured, which made the two readings equal."""
    spec = load_example("quickstart.yaml", **OVERRIDES, **{"roles.actor.gpus": 1, "roles.actor.offload": offload,
                                                            "model.builtin": model}).spec
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
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
        on_host = bool(moments) and all(isinstance(m, DTensor) and m._local_tensor.device.type == "cpu"
                                        and m._local_tensor.is_pinned() for m in moments)
        size = sum(m._local_tensor.numel() * m._local_tensor.element_size() for m in moments)
        return torch.cuda.memory_allocated() - base, size, on_host, stats[-1]["pg_loss"]
    finally:
        group.shutdown()
        gc.collect()
        torch.cuda.empty_cache()


@pytest.mark.parametrize("model", ["tiny", "qwen2-0.5b"])
def test_optimizer_offload_keeps_the_moments_off_the_gpu(model: str):
    """The GPU run twice, the offloaded one between them: the first run allocates what the process keeps for any
    group (the first rollout's caches), so the offloaded run is compared with the second."""
    after_two_updates({}, model)
    offloaded, moment_bytes, on_host, loss = after_two_updates({"optimizer": True}, model)
    on_gpu, gpu_moment_bytes, gpu_on_host, _ = after_two_updates({}, model)
    assert on_host and not gpu_on_host and moment_bytes == gpu_moment_bytes
    print(f"\n{model}: GPU bytes the actor's group holds after two updates: moments on the GPU {on_gpu:,}, "
          f"offloaded {offloaded:,}; the moments are {moment_bytes:,} B ({moment_bytes / 2**30:.2f} GiB)")
    assert on_gpu - offloaded >= 0.9 * moment_bytes, (on_gpu, offloaded, moment_bytes)
    assert loss == loss  # the update ran (not NaN)

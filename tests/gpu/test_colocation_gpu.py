"""idleMemory offload on a CUDA device: between its calls a role that shares its GPU keeps its weights, AdamW
moments and hf rollout model in host memory, and trains exactly as it does alone. (On CPU every tensor is in
host memory, so tests/integration/test_colocation.py cannot show where the state lives.)
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
KEYS = ("input_ids", "attention_mask", "responses", "response_mask", "old_logprobs", "advantages")


def local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def two_updates(colocated: bool, model: str = "tiny") -> tuple[int, list[str], list[float], int]:
    """(GPU bytes the actor's group added over two updates, measured from before it started, the devices its state
    is on, the losses, the state's bytes). Nothing of the group outlives the call (no tensor is returned)."""
    ref = {"gpus": 1, **({"colocateWith": "actor"} if colocated else {})}
    spec = load_example("quickstart.yaml", **OVERRIDES, **{"roles.actor.gpus": 1, "roles.ref": ref,
                                                            "model.builtin": model}).spec
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    group = LocalWorkerGroup("actor", spec, "cuda")
    group.start()
    try:
        actor = ActorProxy(group)
        batch = train_batch(spec, actor)
        losses = [actor.update(batch.select(*KEYS), step=s)["pg_loss"] for s in range(2)]
        torch.cuda.synchronize()
        worker = group.worker
        state = [local(p) for p in worker.trainer.model.parameters()]
        state += [local(st[k]) for st in worker.trainer.optimizer.optimizer.state.values()
                  for k in ("exp_avg", "exp_avg_sq")]
        state += list(worker.engine.model.parameters())
        return (torch.cuda.memory_allocated() - base, sorted({t.device.type for t in state}), losses,
                sum(t.numel() * t.element_size() for t in state))
    finally:
        group.shutdown()
        gc.collect()
        torch.cuda.empty_cache()


@pytest.mark.parametrize("model", ["tiny", "qwen2-0.5b"])
def test_a_colocated_actor_sleeps_in_host_memory_and_trains_the_same(model: str):
    """Asleep between its calls, the actor holds next to nothing on the GPU: its weights, AdamW moments and hf
    rollout model are in host memory (its step counters stay). Measured as what the group adds to the allocator,
    the actor alone first, so that what the process allocates once for any group (the first rollout's caches)
    is there before the asleep run is measured. (Before, two absolute readings compared the asleep run with the
    first run's leftovers in it: the state seemed to leave the GPU only in part.)"""
    alone, devices_alone, losses_alone, state_bytes = two_updates(colocated=False, model=model)
    asleep, devices, losses, _ = two_updates(colocated=True, model=model)
    assert devices_alone == ["cuda"] and devices == ["cpu"]
    print(f"\n{model}: GPU bytes the actor's group holds after two updates: alone {alone:,}, asleep {asleep:,}; "
          f"its state is {state_bytes:,} B ({state_bytes / 2**30:.2f} GiB)")
    assert alone >= state_bytes, (alone, state_bytes)
    assert asleep <= 0.01 * state_bytes + 64 * 1024, (asleep, state_bytes)
    assert losses == pytest.approx(losses_alone, rel=1e-5, abs=1e-7)

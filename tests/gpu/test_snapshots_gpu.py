"""Per-step snapshots of a GPU role: page-locked slot files in host memory, filled by DMA in the background,
from which a fresh group of the role restores its last completed update bit for bit (zero lost steps).
Run: `pytest -m gpu tests/gpu -s` on a machine with a GPU (skipped elsewhere).
"""

from __future__ import annotations

import contextlib
import gc
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kuberl.controller.proxies import ActorProxy
from kuberl.resilience import snapshots
from kuberl.resilience.saves import shard_tensors
from kuberl.workers.groups import LocalWorkerGroup

from ..integration.conftest import load_example
from ..integration.test_offload import OVERRIDES, train_batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
KEYS = ("input_ids", "attention_mask", "responses", "response_mask", "old_logprobs", "advantages")


@contextlib.contextmanager
def host_memory_dir() -> Iterator[str]:
    """A role's snapshot folder in /dev/shm, laid out as the runtime's (`<job>/<run>/<role>.<n>`: the three
    folders the writer checks are this user's own, /dev/shm itself is everyone's)."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as job:
        yield str(Path(job) / "run" / "actor.0")


def state_of(group: LocalWorkerGroup) -> list[torch.Tensor]:
    trainer = group.worker.trainer
    return [t.detach().cpu().clone() for t in shard_tensors(trainer.model, trainer.optimizer.optimizer)]


def test_a_fresh_gpu_actor_restores_its_last_update_from_host_memory_bit_identical():
    """Each update's copy overlaps the next rollout on the same GPU (the runtime's order); the last one is
    finished by the group's shutdown."""
    spec = load_example("quickstart.yaml", **OVERRIDES, **{"roles.actor.gpus": 1}).spec
    with host_memory_dir() as root:
        group = LocalWorkerGroup("actor", spec, "cuda")
        group.start()
        try:
            actor = ActorProxy(group)
            actor.enable_snapshots(root)
            full = train_batch(spec, actor)
            batch, prompts = full.select(*KEYS), full.select("prompt_ids", "prompt_mask")
            for step in range(3):
                actor.update(batch, step=step)  # waits for the copy of the update before it, then changes the state
                trained = state_of(group)  # (before a forward leaves FSDP2's unsharded parameters registered)
                actor.generate(prompts, seed=step)  # the next step's rollout, beside the copy of this update
            saver = group.worker.trainer.saver
            assert saver._slots.registered == {0, 1}, "the slots were not page-locked"
        finally:
            group.shutdown()
            gc.collect()
        assert snapshots.whole_steps(root, 0) == {3: 1, 2: 0}
        fresh = LocalWorkerGroup("actor", spec, "cuda")
        fresh.start()
        try:
            actor = ActorProxy(fresh)
            actor.enable_snapshots(root)
            assert actor.load_snapshot(3) is True
            restored = state_of(fresh)
            assert all(t.is_cuda for t in shard_tensors(fresh.worker.trainer.model,
                                                        fresh.worker.trainer.optimizer.optimizer))
        finally:
            fresh.shutdown()
            gc.collect()
    assert len(restored) == len(trained) and all(torch.equal(a, b) for a, b in zip(restored, trained))


def test_slot_copies_from_the_gpu_go_to_page_locked_memory_and_are_exact():
    state = [torch.randn(64, 1024, 1024, device="cuda") for _ in range(4)]  # 1 GiB
    with host_memory_dir() as root:
        writer = snapshots.SlotWriter(root, 0)
        writer.write(state, step=1)  # maps and page-locks both slots
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        writer.write(state, step=3)  # the same slot, as every other step
        seconds = time.perf_counter() - t0
        registered = set(writer.registered)
        live = [torch.empty_like(t) for t in state]
        snapshots.read_into(root, 0, 3, live)
        writer.close()
    print(f"\nslot copy, GPU -> page-locked host memory: 1 GiB in {seconds * 1000:.0f} ms ({1 / seconds:.1f} GiB/s)")
    assert registered == {0, 1}, "the slots were not page-locked: their copies were synchronous"
    assert all(torch.equal(a, b) for a, b in zip(live, state))

"""A periodic checkpoint written from its step's snapshot slot (`kuberl.resilience.saves`): off the training path, of
the step it names even while training moves on, and the slot kept until it is written; the slots set up before the
first update needs them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch

from kuberl.resilience import snapshots
from kuberl.resilience.checkpoint import trainable_state
from kuberl.resilience.saves import SlotRef, plan_from_slot, planned_shards, shard_tensors

from .test_lora import IDS, logits, small_lm


def trainer():
    from kuberl.training.trainer import FSDPTrainer

    return FSDPTrainer(small_lm(), torch.device("cpu"), torch.float32, lr=1e-2, weight_decay=0.0, grad_clip=1.0)


def update(t) -> None:
    """One update as `FSDPTrainer.fit` runs it: the last snapshot whole first, then a step, then its snapshot."""
    t.saver.before_update()
    logits(t.model, IDS).float().pow(2).mean().backward()
    t.optimizer.step()
    t.optimizer.zero_grad()
    t.trained_step += 1
    t.saver.snapshot(t.model, t.optimizer.optimizer, t.trained_step)


def state_of(t) -> list[torch.Tensor]:
    return [x.detach().clone() for x in shard_tensors(t.model, t.optimizer.optimizer)]


def leaves(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from leaves(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from leaves(v)
    else:
        yield obj


def test_the_slots_are_set_up_for_the_state_before_the_first_update(one_rank_group, tmp_path: Path) -> None:
    t = trainer()
    planned = snapshots.slot_size(planned_shards(t.model, t.optimizer.optimizer))
    t.enable_snapshots(str(tmp_path / "snapshots"))
    deadline = time.monotonic() + 30
    while len(t.saver._slots.bufs) < snapshots.SLOTS and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(t.saver._slots.bufs) == [0, 1]  # reserved in the background, before any update
    update(t)
    assert snapshots.slot_size(shard_tensors(t.model, t.optimizer.optimizer)) == planned
    assert all(b.numel() == planned for b in t.saver._slots.bufs.values())  # not set up again
    t.saver.close()


def test_nothing_of_the_state_is_copied_on_the_training_path(one_rank_group, tmp_path: Path) -> None:
    """Every tensor of the checkpoint's state dict (FSDP2's DTensors, AdamW's moments and steps) is found in the
    snapshot: the plan holds references into the slot and no copy."""
    t = trainer()
    t.enable_snapshots(str(tmp_path / "snapshots"))
    update(t)
    plan = plan_from_slot(trainable_state(t.model, t.optimizer.optimizer), t.saver.last.keys)
    refs = [x for x in leaves(plan) if isinstance(x, SlotRef)]
    assert refs and not [x for x in leaves(plan) if isinstance(x, torch.Tensor)]
    t.saver.close()


def test_the_checkpoint_is_its_steps_state_while_training_goes_on(one_rank_group, tmp_path: Path,
                                                                  monkeypatch) -> None:
    """Saved after update 2, written slowly while updates 3 and 4 run: update 4's snapshot goes to update 2's slot
    only once the checkpoint is written, and a fresh trainer loads update 2's state exactly."""
    import torch.distributed.checkpoint as dcp

    real_save = dcp.save

    def slow_save(*args, **kwargs):
        time.sleep(1.0)  # the slot would be rewritten meanwhile if nothing held it
        return real_save(*args, **kwargs)

    def no_staging(*args, **kwargs):
        raise AssertionError("staged with async_save: the checkpoint was not written from the slot")

    monkeypatch.setattr(dcp, "save", slow_save)
    monkeypatch.setattr(dcp, "async_save", no_staging)
    t = trainer()
    t.enable_snapshots(str(tmp_path / "snapshots"))
    update(t)
    update(t)
    expected = state_of(t)
    path = str(tmp_path / "step_2" / "actor")
    t0 = time.perf_counter()
    assert t.save(path) == 2
    assert time.perf_counter() - t0 < 0.5 and t.saver.pending()  # written in the background
    update(t)
    update(t)  # its snapshot goes to slot 0 (step 2's): it waits for the checkpoint
    assert t.saver.wait() and not t.saver.pending()
    assert snapshots.whole_steps(t.saver.snapshot_root, 0) == {4: 0, 3: 1}
    fresh = trainer()
    fresh.load(path, 2)
    got = state_of(fresh)
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))
    t.saver.close()


def test_a_process_settles_its_objects_once_and_thaws_them_at_shutdown() -> None:
    """kuberl.training.gcfreeze in a fresh interpreter (freezing this one's objects would outlive the test)."""
    import subprocess
    import sys

    script = ("import gc; from kuberl.training import gcfreeze; junk = [[] for _ in range(1000)]; "
              "assert gcfreeze.settle() and not gcfreeze.settle() and gc.get_freeze_count() > 1000; "
              "gcfreeze.thaw(); assert gc.get_freeze_count() == 0 and gcfreeze.settle()")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_write_from_the_slot_that_fails_is_void_and_gives_the_slot_back(one_rank_group, tmp_path: Path,
                                                                          monkeypatch, capsys) -> None:
    from kuberl.resilience.saves import complete

    def torn(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("torch.distributed.checkpoint.filesystem._write_item", torn)
    t = trainer()
    t.enable_snapshots(str(tmp_path / "snapshots"))
    update(t)
    path = tmp_path / "step_1" / "actor"
    t.save(str(path))
    assert t.saver.wait(snapshots=False) == [] and not complete(path)
    assert "that checkpoint is void" in capsys.readouterr().out
    update(t)
    update(t)  # its snapshot goes to the failed checkpoint's slot: not held
    t.saver.wait_snapshots()
    assert snapshots.newest(t.saver.snapshot_root, 0) == 3
    t.saver.close()


def test_a_checkpoint_saved_before_its_snapshot_is_copied_waits_for_that_copy(one_rank_group, tmp_path: Path,
                                                                              monkeypatch) -> None:
    """The save comes while the step's own snapshot is still queued: the copy goes on (it is not held back by the
    checkpoint that waits for it), then the checkpoint is written from it."""
    write = snapshots.SlotWriter.write

    def late(self, *args, **kwargs):
        time.sleep(0.5)  # the copy starts after the save below
        return write(self, *args, **kwargs)

    monkeypatch.setattr(snapshots.SlotWriter, "write", late)
    t = trainer()
    t.enable_snapshots(str(tmp_path / "snapshots"))
    update(t)
    expected = state_of(t)
    path = str(tmp_path / "step_1" / "actor")
    t.save(path)
    done = threading.Thread(target=t.saver.wait)
    done.start()
    done.join(timeout=60)
    assert not done.is_alive(), "the save and its own snapshot wait for each other"
    fresh = trainer()
    fresh.load(path, 1)
    assert all(torch.equal(a, b) for a, b in zip(state_of(fresh), expected))
    t.saver.close()


def test_a_checkpoint_with_no_room_is_void_with_a_warning_that_says_so(one_rank_group, tmp_path: Path, monkeypatch,
                                                                        capsys) -> None:
    """From the slot and without snapshots alike: refused before a byte is written, the slot given back."""
    import shutil
    from collections import namedtuple

    from kuberl.resilience.saves import complete

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(2**40, 2**40, 1024))
    t = trainer()
    t.enable_snapshots(str(tmp_path / "snapshots"))
    update(t)
    t.save(str(tmp_path / "step_1" / "actor"))
    assert t.saver.wait(snapshots=False) == [] and not complete(tmp_path / "step_1" / "actor")
    t.saver.snapshot_root = None  # snapshots off: DCP's async_save path
    t.save(str(tmp_path / "step_1b" / "actor"))
    assert t.saver.wait(snapshots=False) == []
    out = capsys.readouterr().out
    assert out.count("GiB free (free some, or lower spec.trainer.checkpoint.keep)); that checkpoint is void") == 2
    assert "Traceback" not in out
    t.saver.close()


def _agree(rank: int, store: str, out: str) -> None:
    """One rank of two: rank 1 has no room; both must give up (DCP's collectives would wait for it forever)."""
    import torch.distributed as dist

    from kuberl.resilience.saves import AsyncSaver
    from kuberl.resilience.snapshots import NoRoom

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    saver = AsyncSaver()

    def check() -> int:
        if rank == 1:
            raise NoRoom("full")
        return 7

    try:
        saver._ready_everywhere(check)
        Path(out, str(rank)).write_text("went on")
    except Exception as exc:
        Path(out, str(rank)).write_text(f"{type(exc).__name__}: {exc}")
    finally:
        dist.destroy_process_group()


def test_a_rank_without_room_makes_every_rank_give_up_the_checkpoint(netns, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(_agree, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, start_method="spawn")
    assert (tmp_path / "1").read_text() == "NoRoom: full"
    assert (tmp_path / "0").read_text().startswith("Unusable: another rank of the role cannot write its part")


def test_a_save_waits_for_the_previous_writes_collectives_not_its_disk(one_rank_group, tmp_path: Path,
                                                                        monkeypatch) -> None:
    """Two saves two steps apart: the second starts while the first one's files are still being made durable (a
    slow disk), instead of waiting for that on the training path; both end complete."""
    from kuberl.resilience import saves

    real_fsync = saves.fsync_tree
    monkeypatch.setattr(saves, "fsync_tree", lambda path: (time.sleep(2.0), real_fsync(path)))
    t = trainer()
    t.enable_snapshots(str(tmp_path / "snapshots"))
    update(t)
    t.save(str(tmp_path / "step_1" / "actor"))
    update(t)
    t0 = time.perf_counter()
    t.save(str(tmp_path / "step_2" / "actor"))
    assert time.perf_counter() - t0 < 1.0 and t.saver.pending()
    assert len(t.saver.wait(snapshots=False)) == 2
    assert saves.complete(tmp_path / "step_1" / "actor") and saves.complete(tmp_path / "step_2" / "actor")
    t.saver.close()

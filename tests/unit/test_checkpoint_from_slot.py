"""A periodic checkpoint written from its step's snapshot slot (`kuberl.resilience.saves`): off the training path, of
the step it names even while training moves on, and the slot kept until it is written; the slots set up before the
first update needs them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from kuberl.resilience import snapshots
from kuberl.resilience.checkpoint import trainable_state
from kuberl.resilience.saves import SlotRef, plan_from_slot, planned_shards, shard_tensors, snapshot_plan

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


@pytest.mark.parametrize("step, in_slot, held, want", [
    (3, {0: 2, 1: 1}, set(), ("write", 1)),  # the usual: step 2 stays whole while slot 1 is rewritten
    (1, {}, set(), ("write", 1)),  # the first: the checkpoint (or the model path) is what stays
    (4, {0: 2, 1: 3}, {0}, ("write", 1)),  # slot 0 is read by step 2's checkpoint: step 3's is rewritten
    (10, {0: 2, 1: 9}, {0}, ("write", 1)),  # step 2 (read, whole) stays: 8 updates to run again at most
    (11, {0: 2, 1: 10}, {0}, ("skip", -1)),  # rewriting step 10 would leave step 2, 9 updates back
    (19, {0: 2, 1: 10}, {0}, ("wait", 0)),  # skipping would leave step 10, 9 back: it waits for slot 0's reader
    (4, {0: 2, 1: 3}, {0, 1}, ("skip", -1)),  # both read (two checkpoints in flight)
    (21, {0: 10}, set(), ("write", 0)),  # a rank resumed from a later checkpoint: the stale snapshot goes
])
def test_a_snapshot_is_skipped_only_while_a_checkpoint_reads_its_slot_and_within_the_replay_window(
        step, in_slot, held, want) -> None:
    assert snapshot_plan(step, in_slot, held, window=8) == want
    assert snapshot_plan(step, in_slot, held, window=8, skip=False)[0] != "skip"


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


def slow_writes(monkeypatch, seconds: float = 1.0) -> None:
    """Checkpoint writes that take `seconds` longer (a slow disk), and none staged on the training path."""
    import torch.distributed.checkpoint as dcp

    real_save = dcp.save

    def slow_save(*args, **kwargs):
        time.sleep(seconds)  # the slot would be rewritten meanwhile if nothing held it
        return real_save(*args, **kwargs)

    def no_staging(*args, **kwargs):
        raise AssertionError("staged with async_save: the checkpoint was not written from the slot")

    monkeypatch.setattr(dcp, "save", slow_save)
    monkeypatch.setattr(dcp, "async_save", no_staging)


def test_the_checkpoint_is_its_steps_state_while_training_goes_on(one_rank_group, tmp_path: Path,
                                                                  monkeypatch) -> None:
    """Saved after update 2, written slowly while updates 3 to 5 run: their snapshots go to the other slot, none
    waits for the checkpoint, and step 2's slot stays whole until it is written; the checkpoint loads as update
    2's state exactly, and the next snapshot after the write goes to step 2's slot again."""
    slow_writes(monkeypatch)
    t = trainer()
    t.enable_snapshots(str(tmp_path / "snapshots"))
    update(t)
    update(t)
    expected = state_of(t)
    path = str(tmp_path / "step_2" / "actor")
    t0 = time.perf_counter()
    assert t.save(path) == 2
    assert time.perf_counter() - t0 < 0.5 and t.saver.pending()  # written in the background
    t0 = time.perf_counter()
    for _ in range(3):
        update(t)
    assert time.perf_counter() - t0 < 0.5 and t.saver.pending() and t.saver.skips == 0
    assert t.saver.wait() and not t.saver.pending()
    assert snapshots.whole_steps(t.saver.snapshot_root, 0) == {2: 0, 5: 1}
    update(t)
    t.saver.wait()
    assert snapshots.whole_steps(t.saver.snapshot_root, 0) == {6: 0, 5: 1}
    fresh = trainer()
    fresh.load(path, 2)
    got = state_of(fresh)
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))
    t.saver.close()


def test_a_restart_from_the_snapshot_a_checkpoint_reads_runs_the_updates_since_again_to_the_same_state(
        one_rank_group, tmp_path: Path, monkeypatch) -> None:
    """While a slow checkpoint reads step 2's slot, steps 3 to 5 are snapshotted into the other slot, each over the
    last. A new rank restored from the snapshot a rank dying in step 5's copy would come back from (step 2's,
    whole all along) and running updates 3 to 5 again holds the same parameters and AdamW moments, bit for bit,
    as the rank that never died."""
    slow_writes(monkeypatch, 2.0)
    root = str(tmp_path / "snapshots")
    t = trainer()
    t.enable_snapshots(root)
    update(t)
    update(t)
    t.save(str(tmp_path / "step_2" / "actor"))
    for _ in range(3):
        update(t)
    t.saver.wait_snapshots()
    assert snapshots.whole_steps(root, 0) == {2: 0, 5: 1} and t.saver.pending()
    expected = state_of(t)
    t.saver.wait()
    t.saver.close()
    fresh = trainer()
    fresh.enable_snapshots(root)
    fresh.load_snapshot(2)
    for _ in range(3):
        update(fresh)
    fresh.saver.wait()
    assert all(torch.equal(a, b) for a, b in zip(state_of(fresh), expected))
    fresh.saver.close()


def test_past_the_replay_window_a_snapshot_is_skipped_and_a_save_of_that_step_takes_it_later(
        one_rank_group, tmp_path: Path, monkeypatch) -> None:
    """With a window of 2 updates, step 5's snapshot would leave step 2's (the one the slow checkpoint reads) 3
    updates back: it is skipped. The save of step 5 then waits for nothing on the training path; the snapshot is
    copied into step 2's slot once that write is done, and the checkpoint of step 5 is written from it."""
    from kuberl.resilience import saves

    monkeypatch.setattr(saves, "REPLAY_WINDOW", 2)
    slow_writes(monkeypatch)
    t = trainer()
    t.enable_snapshots(str(tmp_path / "snapshots"))
    update(t)
    update(t)
    t.save(str(tmp_path / "step_2" / "actor"))
    for _ in range(3):
        update(t)
    assert t.saver.skips == 1
    expected = state_of(t)
    path = str(tmp_path / "step_5" / "actor")
    t0 = time.perf_counter()
    assert t.save(path) == 5
    assert time.perf_counter() - t0 < 0.5 and t.saver.pending()
    assert t.saver.wait(snapshots=False) == [str(tmp_path / "step_2" / "actor"), path]
    t.saver.wait()
    assert snapshots.whole_steps(t.saver.snapshot_root, 0) == {5: 0, 4: 1}
    fresh = trainer()
    fresh.load(path, 5)
    assert all(torch.equal(a, b) for a, b in zip(state_of(fresh), expected))
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


def _vote(rank: int, store: str, out: str) -> None:
    """One rank of two, each with its own slots: only rank 1's checkpoint still reads slot 1 (step 1's); both
    write step 3's snapshot over step 2's, so that both keep the same whole steps (1 and 3)."""
    from concurrent.futures import Future

    import torch.distributed as dist

    from kuberl.resilience.saves import AsyncSaver

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    saver = AsyncSaver()
    saver.snapshot_root = str(Path(out) / "snapshots")
    for step in (1, 2):
        saver.snapshot(model, optimizer, step)
        saver.wait_snapshots()
    if rank == 1:
        saver._slots.readers[1] = [(1, Future())]  # a checkpoint of step 1 still being written on this rank only
    saver.snapshot(model, optimizer, 3)
    saver.wait_snapshots()
    Path(out, str(rank)).write_text(f"{saver.skips} {sorted(snapshots.whole_steps(saver.snapshot_root, rank))}")
    saver._slots.readers.clear()
    saver.close()
    dist.destroy_process_group()


def test_the_ranks_of_a_role_skip_the_same_snapshots(netns, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(_vote, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, start_method="spawn")
    assert (tmp_path / "0").read_text() == (tmp_path / "1").read_text() == "0 [1, 3]"

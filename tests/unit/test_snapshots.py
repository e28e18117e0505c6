"""kuberl.resilience.snapshots: two alternating slot files per rank, whole or never read, that outlive their writer."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kuberl.resilience import snapshots

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


def state(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 5, generator=g), torch.randn(7, generator=g).to(torch.bfloat16),
            torch.randint(0, 9, (2, 2), generator=g)]


def test_a_written_step_reads_back_bit_identical_and_the_older_slot_survives(tmp_path):
    writer = snapshots.SlotWriter(tmp_path, rank=1)
    writer.write(state(2), step=2)
    writer.write(state(3), step=3)
    assert snapshots.whole_steps(tmp_path, 1) == {2: 0, 3: 1}
    assert snapshots.newest(tmp_path, 1) == 3 and snapshots.newest(tmp_path, 0) is None
    for step in (2, 3):
        live = [torch.zeros_like(t) for t in state(0)]
        snapshots.read_into(tmp_path, 1, step, live)
        assert all(torch.equal(a, b) for a, b in zip(live, state(step)))
    writer.write(state(4), step=4)  # into step 2's slot: step 3 stays whole
    assert snapshots.whole_steps(tmp_path, 1) == {4: 0, 3: 1}
    with pytest.raises(FileNotFoundError, match="step 2"):
        snapshots.read_into(tmp_path, 1, 2, [torch.zeros_like(t) for t in state(0)])
    writer.close()


def test_each_view_of_a_slot_has_its_own_bytes_as_storage(tmp_path):
    """A checkpoint writer (torch DCP's loader) copies a tensor whose storage is larger than the tensor before it
    writes it; a slot's views are written as they are: each one's storage is its own bytes, in the slot's memory."""
    writer = snapshots.SlotWriter(tmp_path, rank=0)
    writer.write(state(2), step=2)
    views = writer.views(2)
    base = writer.bufs[0].data_ptr()
    assert all(v.untyped_storage().size() == v.nbytes for v in views)
    assert [v.data_ptr() - base for v in views] == [e.offset for e in snapshots.layout_of(state(2))]
    assert all(torch.equal(v, t) for v, t in zip(views, state(2)))
    writer.close()


def test_a_torn_slot_is_never_read(tmp_path):
    writer = snapshots.SlotWriter(tmp_path, rank=0)
    writer.write(state(1), step=1)
    writer.write(state(2), step=2)
    (tmp_path / "rank_0.slot0.json").unlink()  # step 2: its writer died between the rewrite and the rename
    assert snapshots.newest(tmp_path, 0) == 1
    (tmp_path / "rank_0.slot1.json").write_text("{\"step\": 1, \"lay")  # a torn json reads as torn too
    assert snapshots.newest(tmp_path, 0) is None


def test_another_layout_is_refused(tmp_path):
    snapshots.SlotWriter(tmp_path, rank=0).write(state(1), step=1)
    with pytest.raises(RuntimeError, match="another layout"):
        snapshots.read_into(tmp_path, 0, 1, [torch.zeros(3, 4)])


def test_the_snapshot_outlives_the_process_that_wrote_it(tmp_path):
    script = (f"import os, sys, torch; sys.path.insert(0, {str(RUNTIME)!r}); from kuberl.resilience import snapshots; "
              f"snapshots.SlotWriter({str(tmp_path)!r}, 0).write([torch.arange(10.0)], 5); os._exit(9)")
    assert subprocess.run([sys.executable, "-c", script], timeout=120).returncode == 9
    live = [torch.zeros(10)]
    snapshots.read_into(tmp_path, 0, 5, live)
    assert torch.equal(live[0], torch.arange(10.0))


@pytest.fixture
def saver(tmp_path, request):
    """An AsyncSaver on a one-rank gloo group."""
    import torch.distributed as dist

    from kuberl.resilience.saves import AsyncSaver

    if not dist.is_initialized():  # an earlier in-process test of the session may have made it
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
        request.addfinalizer(dist.destroy_process_group)
    return AsyncSaver()


def test_the_copy_overlaps_what_comes_next_and_the_next_update_waits_for_it(tmp_path, saver, monkeypatch):
    slow = snapshots.SlotWriter.write

    def write(self, *args):
        time.sleep(0.5)
        slow(self, *args)

    monkeypatch.setattr(snapshots.SlotWriter, "write", write)
    saver.snapshot_root = str(tmp_path / "snapshots")
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    t0 = time.perf_counter()
    saver.snapshot(model, opt, 1)
    assert time.perf_counter() - t0 < 0.4 and snapshots.newest(saver.snapshot_root, 0) is None  # in flight
    saver.before_update()
    assert snapshots.newest(saver.snapshot_root, 0) == 1 and saver.waited_s >= 0.3


def test_a_snapshot_holds_the_trainable_state_only():
    from kuberl.resilience.saves import shard_tensors

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    model[0].requires_grad_(False)  # frozen, as LoRA's base weights: built again from the model path
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    out = shard_tensors(model, opt)
    trained = [model[1].weight, model[1].bias]
    moments = [opt.state[p][k] for p in trained for k in sorted(opt.state[p])]
    assert len(out) == 2 + len(moments) and all(a is b for a, b in zip(out, trained + moments))


def test_a_failed_checkpoint_write_is_a_warning_and_never_complete(tmp_path, saver, capsys, monkeypatch):
    from kuberl.resilience.saves import complete

    def torn(*args, **kwargs):  # as DCP's writer failed once on the H200: in the background, mid-file
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr("torch.distributed.checkpoint.filesystem._write_item", torn)
    model = torch.nn.Linear(3, 2)
    path = tmp_path / "step_1" / "actor"
    saver.save(model, torch.optim.AdamW(model.parameters()), str(path))
    assert saver.wait() == [] and not complete(path)
    out = capsys.readouterr().out
    assert "warning: checkpoint write to" in out and "that checkpoint is void" in out and "Traceback" not in out
    # on the H200 this was a full disk: the room left is named
    assert "(RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598; a short write" in out
    assert " GiB free under " in out


def test_no_room_for_the_slots_turns_snapshots_off_for_the_rank_with_a_warning(tmp_path, capsys, monkeypatch,
                                                                                 saver):
    def full(fd, offset, size):
        raise OSError(28, "No space left on device")

    root = tmp_path / "snapshots"
    saver.snapshot_root = str(root)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    monkeypatch.setattr("os.posix_fallocate", full)
    saver.snapshot(model, opt, 1)
    assert saver.wait() == [] and saver.snapshot_root is None
    assert "snapshots off for rank 0: " in (out := capsys.readouterr().out) and "No space left" in out
    assert list(root.iterdir()) == []
    saver.snapshot(model, opt, 2)  # off from now on: nothing is written
    assert saver.wait() == []


def test_no_room_to_mark_a_slot_whole_turns_snapshots_off_and_leaves_no_whole_slot(tmp_path, capsys, monkeypatch,
                                                                                     saver):
    """The disk fills between the slots' allocation and the small file that marks a slot whole (the slots beside
    the checkpoints, on a full volume): a warning and snapshots off, never a failed rank."""
    real_fdopen = os.fdopen

    def full(fd, *args, **kwargs):
        f = real_fdopen(fd, *args, **kwargs)
        f.write = lambda data: (_ for _ in ()).throw(OSError(28, "No space left on device"))
        return f

    root = tmp_path / "snapshots"
    saver.snapshot_root = str(root)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    monkeypatch.setattr(snapshots.os, "fdopen", full)
    saver.snapshot(model, opt, 1)
    assert saver.wait() == [] and saver.snapshot_root is None
    assert "snapshots off for rank 0: no room to mark the snapshot of step 1 whole" in capsys.readouterr().out
    assert snapshots.whole_steps(root, 0) == {}


def test_a_folder_others_can_write_or_a_link_on_the_path_is_refused(tmp_path):
    snapshots.private_dir(tmp_path / "run" / "actor.0")
    assert oct((tmp_path / "run").stat().st_mode & 0o777) == "0o700"
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)  # as another local user's pre-made folder in /dev/shm
    with pytest.raises(snapshots.NotPrivate, match="open"):
        snapshots.private_dir(tmp_path / "open" / "actor.0")
    (tmp_path / "link").symlink_to(tmp_path / "run")
    with pytest.raises(snapshots.NotPrivate, match="link"):
        snapshots.private_dir(tmp_path / "link" / "actor.0")


def test_a_slot_larger_than_the_free_space_is_refused_before_it_is_allocated(tmp_path):
    writer = snapshots.SlotWriter(tmp_path, rank=0)
    snapshots.private_dir(tmp_path)
    with pytest.raises(snapshots.NoRoom, match="GiB free"):
        writer._check_room(2**62)
    assert snapshots.fs_type(Path("/proc/self")) == "proc"


def test_checkpoint_writes_turn_the_crc_off_while_any_runs_and_back_after_the_last() -> None:
    """Two roles of one process write at once: the process-wide setting is restored only after both."""
    from torch.utils.serialization import config

    from kuberl.resilience.saves import _NO_CRC

    assert config.save.compute_crc32
    with _NO_CRC:
        with _NO_CRC:
            assert not config.save.compute_crc32
        assert not config.save.compute_crc32  # the other write still runs
    assert config.save.compute_crc32

"""kuberl.controller.role_state.RoleState: the books of the trainable roles' checkpoints and snapshots (no role is
called)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kuberl.controller import role_state
from kuberl.controller.job_errors import CheckpointUntrusted, JobFailed
from kuberl.controller.role_state import RoleState
from kuberl.resilience import checkpoint, identity, saves


def update(*args):
    return lambda: None, args, {}


def test_the_updates_after_the_restored_step_run_again_when_all_are_kept() -> None:
    state = RoleState(None, "job")
    kept = {step: update(f"batch {step}") for step in range(1, 13)}
    for step, call in kept.items():
        state.updated("actor", step, call)
    state.updated("ref", 12, update("other"))  # a frozen role: not kept
    assert state.trained == {"actor": 12, "critic": 0} and set(state.updates) == {"actor"}
    assert state.updates_to_repeat("actor", 11) == [kept[12]]  # died before step 12's snapshot was whole
    assert state.updates_to_repeat("actor", 9) == [kept[10], kept[11], kept[12]]  # 10 and 11 skipped too
    assert state.updates_to_repeat("actor", 12) == []
    assert state.updates_to_repeat("actor", 12 - saves.REPLAY_WINDOW) == [kept[s] for s in range(5, 13)]
    assert state.updates_to_repeat("actor", 11 - saves.REPLAY_WINDOW) == []  # older than the window: not kept
    assert state.updates_to_repeat("critic", 0) == []  # none kept
    assert state.restored("actor", 11) == 1 and state.trained["actor"] == 11  # one committed update lost
    assert state.updates_to_repeat("actor", 10) == [kept[11]]
    state.loaded("actor", 15)
    assert state.trained["actor"] == 15 and "actor" not in state.updates


@pytest.mark.parametrize("seen, last_checkpoint, want", [
    ([4, 4], 2, 4), ([4, 3], 2, 3),  # the step every rank holds
    ([4, None], 2, None),  # a rank holds none: the checkpoint
    ([2], 3, None),  # older than the last checkpoint
    ([0], 0, None),
])
def test_a_restore_loads_the_snapshot_every_rank_holds_unless_the_checkpoint_is_newer(seen, last_checkpoint,
                                                                                       want) -> None:
    state = RoleState(None, "job")
    state.at_checkpoint(last_checkpoint)
    assert state.snapshot_to_load(seen) == want


def test_snapshot_folders_are_per_run_and_role_size(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(role_state, "HOST_MEMORY", tmp_path / "shm")
    state = RoleState(tmp_path / "ckpt", "job")
    assert RoleState(None, "job").snapshot_dir("actor", gpus=False) is None
    on_disk = state.snapshot_dir("critic", gpus=False)
    assert on_disk == tmp_path / "ckpt" / "snapshots" / state.run_id / "critic.0"
    assert state.snapshot_dir("actor", gpus=True).parent.parent == tmp_path / "ckpt" / "snapshots"  # no host memory
    (tmp_path / "shm").mkdir()
    in_memory = state.snapshot_dir("actor", gpus=True)
    assert in_memory.parent.parent.parent == tmp_path / "shm" and in_memory.name == "actor.0"
    on_disk.mkdir(parents=True)
    state.resized("critic", gpus=False)
    assert not on_disk.exists() and state.snapshot_dir("critic", gpus=False).name == "critic.1"
    in_memory.mkdir(parents=True)
    state.drop_snapshots(host_memory_only=True)
    assert not in_memory.exists() and (tmp_path / "ckpt" / "snapshots").is_dir()
    state.drop_snapshots()
    assert not (tmp_path / "ckpt" / "snapshots").exists()


def test_pending_checkpoints_are_completed_or_removed_oldest_first(tmp_path: Path, capsys) -> None:
    state = RoleState(tmp_path, "job")
    state.remember_record()
    for step in (2, 4):  # two in flight
        state.hold(step, checkpoint.fresh_step_dir(tmp_path, step), None)
    assert [p.step for p in state.pending] == [2, 4]
    for pending, torn in zip(state.take_pending(), ([], ["critic"])):
        state.complete(pending, torn, keep=3)
    assert state.pending == []
    assert state.last_checkpoint == 2 and checkpoint.latest(tmp_path) == 2
    assert checkpoint.read_state(tmp_path, 2) == {"step": 2}
    assert not checkpoint.step_dir(tmp_path, 4).exists()
    assert "[job] checkpoint of step 4 removed: the part of critic is incomplete" in capsys.readouterr().out
    state.void(6, checkpoint.fresh_step_dir(tmp_path, 6), ["actor holds step 5"])
    assert not checkpoint.step_dir(tmp_path, 6).exists()
    assert "checkpoint of step 6 not saved: actor holds step 5" in capsys.readouterr().out


def test_a_checkpoint_is_refused_once_the_job_record_changed(tmp_path: Path) -> None:
    state = RoleState(tmp_path, "job")
    with pytest.raises(ValueError, match="checkpoint_root"):
        RoleState(None, "job").checkpoint_of("actor", 1)
    state.remember_record()
    assert state.checkpoint_of("actor", 2) == str(checkpoint.step_dir(tmp_path, 2) / "actor")
    (tmp_path / identity.IDENTITY_FILE).write_text("{}")
    with pytest.raises(CheckpointUntrusted, match="changed while job 'job' ran") as err:
        state.checkpoint_of("actor", 2)
    assert isinstance(err.value, JobFailed)

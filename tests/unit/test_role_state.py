"""kuberl.controller.role_state.RoleState: the books of the trainable roles' checkpoints and snapshots (no role is
called)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kuberl.controller import role_state
from kuberl.controller.job_errors import CheckpointUntrusted, JobFailed
from kuberl.controller.role_state import RoleState
from kuberl.resilience import checkpoint, identity


def update(*args):
    return lambda: None, args, {}


def test_an_update_runs_again_only_on_a_restore_one_step_short_of_it() -> None:
    state = RoleState(None, "job")
    fn, args, kwargs = update("batch")
    state.updated("actor", 3, (fn, args, kwargs))
    state.updated("ref", 3, update("other"))  # a frozen role: not kept
    assert state.trained == {"actor": 3, "critic": 0} and set(state.updates) == {"actor"}
    assert state.update_to_repeat("actor", 2) == (fn, args, kwargs)
    assert state.update_to_repeat("actor", 3) is None and state.update_to_repeat("actor", 1) is None
    assert state.update_to_repeat("critic", -1) is None  # none kept
    assert state.restored("actor", 2) == 1 and state.trained["actor"] == 2  # one committed update lost
    assert state.update_to_repeat("actor", 2) is None  # its trained step is no longer the update's
    state.loaded("actor", 5)
    assert state.trained["actor"] == 5 and "actor" not in state.updates


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


def test_a_pending_checkpoint_is_completed_or_removed(tmp_path: Path, capsys) -> None:
    state = RoleState(tmp_path, "job")
    state.remember_record()
    for step, torn in ((2, []), (4, ["critic"])):
        folder = checkpoint.fresh_step_dir(tmp_path, step)
        state.hold(step, folder, None)
        state.complete(state.take_pending(), torn, keep=3)
        assert state.pending is None
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

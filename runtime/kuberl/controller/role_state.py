"""The trainable roles' saved state, as the driver keeps account of it: the books behind `kuberl.library.Roles`.

`RoleState` keeps, for the roles with trained state (`TRAINING_ROLES`: actor, critic),

- each role's trained step (its last completed update) and its last `saves.REPLAY_WINDOW` updates' calls, run
  again on a restore that came back short of them (`Roles.recover`);
- the checkpoints: the newest complete one, those whose writes are in flight (`PendingCheckpoint`, at most
  IN_FLIGHT) and the step being saved; whether a checkpoint folder is still this job's (the job record, the DCP index);
- the snapshots: where each role's ranks keep them (host memory, or beside the checkpoints; one folder per run
  and role size), and which snapshot a restore loads.

It makes no call to a role: `Roles` makes the calls and hands it what they returned.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kuberl import logs
from kuberl.controller.job_errors import CheckpointUntrusted
from kuberl.resilience import checkpoint, dcp_reader, identity, saves
from kuberl.spec.model import TRAINING_ROLES

log = logs.get("checkpoint")

HOST_MEMORY = Path("/dev/shm")  # where roles with GPUs keep their per-step snapshots (gigabytes each step)

Update = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]  # a completed update: method, args, kwargs
IN_FLIGHT = 2  # checkpoints written at once: a save waits for the oldest's writes only when this many are in flight


@dataclass
class PendingCheckpoint:
    """A checkpoint whose writes are in flight: committed (its state file written) once all are whole."""

    step: int
    folder: Path
    state: dict[str, Any]


class RoleState:
    """The books of the trainable roles' checkpoints and snapshots for one run of a job (see the module doc).
    `checkpoint_root` None: no checkpoints and no snapshots; `name` prefixes the lines it prints."""

    def __init__(self, checkpoint_root: Path | None, name: str):
        self.name = name
        self.checkpoint_root = checkpoint_root
        self.snapshot_root = checkpoint_root / "snapshots" if checkpoint_root is not None else None
        self.run_id = uuid.uuid4().hex[:12]  # this run's snapshots only: never another run's, nor another size's
        self.resizes = {r: 0 for r in TRAINING_ROLES}
        self.trained = {r: 0 for r in TRAINING_ROLES}  # each role's trained step: its last completed update
        self.updates: dict[str, deque[tuple[int, Update]]] = {}  # role -> its last updates and their trained steps
        self.pending: list[PendingCheckpoint] = []  # in flight, oldest first (at most IN_FLIGHT)
        self.saving = 0  # the step whose checkpoint is being saved
        self.last_checkpoint = 0  # the newest complete checkpoint's step (0: none)
        self.record: bytes | None = None  # the job record in the checkpoint root when the roles started

    # -- trained steps -----------------------------------------------------------------------------
    def updated(self, role: str, step: int, update: Update) -> None:
        """`role` completed its update of step `step` (1-based): kept, to run again on a short restore."""
        if role in TRAINING_ROLES:
            self.trained[role] = step
            self.updates.setdefault(role, deque(maxlen=saves.REPLAY_WINDOW)).append((step, update))

    def loaded(self, role: str, step: int) -> None:
        """`role` loaded the checkpoint of step `step`: that is its trained step, and no update is kept."""
        self.trained[role] = step
        self.updates.pop(role, None)

    def updates_to_repeat(self, role: str, held: int) -> list[Update]:
        """The role's completed updates after restored state `held`, oldest first, when all of them are kept (it
        died before their snapshots were whole, or while they were skipped: `saves.snapshot_plan`); else []."""
        kept = {step: update for step, update in self.updates.get(role, ())}
        steps = range(held + 1, self.trained[role] + 1)
        return [kept[s] for s in steps] if all(s in kept for s in steps) else []

    def restored(self, role: str, held: int) -> int:
        """`role` now holds trained step `held` after a restart; returns the committed updates it lost."""
        lost = max(0, self.trained[role] - held)
        self.trained[role] = held
        return lost

    # -- checkpoints -------------------------------------------------------------------------------
    def root(self) -> Path:
        if self.checkpoint_root is None:
            raise ValueError("Roles(checkpoint_root=...) is needed to save or load checkpoints")
        return self.checkpoint_root

    def remember_record(self) -> None:
        """Keep the job record as it is now, when the roles start (`checkpoint_of` compares with it)."""
        self.record = identity.record(self.checkpoint_root) if self.checkpoint_root is not None else None

    def checkpoint_of(self, role: str, step: int) -> str:
        """`role`'s folder in the checkpoint of `step`, once it is found to be this job's: the job record as
        it was when the roles started, and the DCP index (where the driver sees it: a shared volume) data only.
        Raises CheckpointUntrusted otherwise; the workers read the index through the same allow-list."""
        root = self.root()
        if identity.record(root) != self.record:
            raise CheckpointUntrusted(
                f"{root / identity.IDENTITY_FILE} changed while job {self.name!r} ran: something else writes its "
                f"checkpoint folder, so none of its checkpoints is loaded (fix: give the job a volume of its own)")
        folder = checkpoint.step_dir(root, step) / role
        if (folder / ".metadata").is_file():
            try:
                dcp_reader.read_metadata(folder / ".metadata")
            except dcp_reader.CheckpointRefused as exc:
                raise CheckpointUntrusted(str(exc)) from None
        return str(folder)

    def begin_save(self, step: int) -> None:
        """The checkpoint of `step` is being saved: a failure from now on is recorded in its phase and step."""
        self.saving = step

    def hold(self, step: int, folder: Path, state: dict[str, Any] | None) -> None:
        """The checkpoint of `step` in `folder` is written in the background; `state` is its state file."""
        self.pending.append(PendingCheckpoint(step, folder, state if state is not None else {"step": step}))

    def void(self, step: int, folder: Path, stale: list[str]) -> None:
        """Remove the checkpoint of `step`: a role's part in it (`stale`: why) holds older state."""
        shutil.rmtree(folder, ignore_errors=True)
        log.info(f"checkpoint of step {step} not saved: {', '.join(stale)} (restored from older state after a "
                 f"failure); the newest complete checkpoint stays step {self.last_checkpoint}",
                 extra={"job": self.name, "step": step})

    def take_pending(self) -> list[PendingCheckpoint]:
        """The checkpoints in flight, oldest first, which are then no longer pending (`complete` decides each
        one's fate, in that order)."""
        pending, self.pending = self.pending, []
        return pending

    def complete(self, pending: PendingCheckpoint, torn: list[str], keep: int) -> None:
        """Mark `pending` complete (its state file; `keep` checkpoints kept) unless a role's part of it is
        `torn` or the state file cannot be written: then it is removed and the newest complete one stays."""
        if torn:
            shutil.rmtree(pending.folder, ignore_errors=True)
            log.info(f"checkpoint of step {pending.step} removed: the part of {', '.join(torn)} is incomplete (a "
                     f"failure during its write); the newest complete checkpoint stays step {self.last_checkpoint}",
                     extra={"job": self.name, "step": pending.step})
            return
        try:
            checkpoint.write_state(self.root(), pending.step, pending.state, keep)
        except OSError as exc:  # no room for the state file: the checkpoint is void, training goes on
            shutil.rmtree(pending.folder, ignore_errors=True)
            log.warning(f"checkpoint of step {pending.step} is void (its state file: {exc.strerror}); training goes "
                        f"on and the newest complete checkpoint stays step {self.last_checkpoint}",
                        extra={**logs.STDOUT, "job": self.name, "step": pending.step})
            return
        self.last_checkpoint = pending.step

    def at_checkpoint(self, step: int) -> None:
        """The run holds the complete checkpoint of `step` (resumed from it, or loaded it)."""
        self.last_checkpoint = step

    # -- snapshots ---------------------------------------------------------------------------------
    def snapshot_dir(self, role: str, gpus: bool) -> Path | None:
        """Where `role`'s ranks keep their snapshots (None: no checkpoint root, so none): host memory for a
        role with GPUs (a disk does not take gigabytes every step), else beside the checkpoints (on Kubernetes
        their volume, which a standby pod can read too). One folder per run and role size, so that slots left
        on a worker's host by an earlier run (a driver restarted on Kubernetes) or by the role before a resize
        are never read."""
        if self.snapshot_root is None:
            return None
        base = self._host_snapshots() if gpus and HOST_MEMORY.is_dir() else self.snapshot_root
        return base / self.run_id / f"{role}.{self.resizes[role]}"

    def _host_snapshots(self) -> Path:
        """This job's snapshot folder in host memory, keyed by its checkpoint root: two jobs never share one."""
        key = hashlib.sha256(str(self.snapshot_root.resolve()).encode()).hexdigest()[:16]
        return HOST_MEMORY / f"kuberl-snapshots-{key}"

    def drop_snapshots(self, host_memory_only: bool = False) -> None:
        """Remove the roles' snapshots (those in host memory are never left behind by a run that ends)."""
        if self.snapshot_root is not None:
            shutil.rmtree(self._host_snapshots(), ignore_errors=True)
            if not host_memory_only:
                shutil.rmtree(self.snapshot_root, ignore_errors=True)

    def resized(self, role: str, gpus: bool) -> None:
        """`role` runs at another world size: its snapshots (per rank, for the old size) are dropped, and new
        ones go to a folder of their own."""
        folder = self.snapshot_dir(role, gpus)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        self.resizes[role] += 1

    def snapshot_to_load(self, seen: list[int | None]) -> int | None:
        """The snapshot step a restarted role loads, from what each of its ranks holds (`seen`, None: nothing):
        the step all hold, if it is not older than the last checkpoint; else None (load the checkpoint)."""
        snap = min(seen) if None not in seen else None  # type: ignore[type-var]
        return snap if snap is not None and snap >= self.last_checkpoint and snap > 0 else None

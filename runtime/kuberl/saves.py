"""A trainable rank's state writes, asynchronous: per-step snapshots and periodic checkpoints (torch DCP).

Each write is a DCP `async_save` on the rank's own gloo group: the state is staged (copied) before the
call returns, so training goes on while a background thread writes it; `commit()` waits for every write
in flight. Writes run one at a time, in the order they were started, so the ranks' collectives inside
DCP always meet. DCP writes a folder's `.metadata` last, after every rank's shards: a folder without it
is torn and is never loaded.

    <snapshots>/<role>/step_000007/     the role's state after its 7th update (the newest two are kept)

A snapshot lives on storage that outlives the rank (the checkpoint volume, or local disk on one host),
so a restarted rank resumes from its last completed step instead of the last periodic checkpoint.
"""

from __future__ import annotations

import shutil
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

METADATA = ".metadata"
KEEP_SNAPSHOTS = 2


def complete(path: str | Path) -> bool:
    """Whether `path` holds a whole DCP checkpoint (its metadata is written after every shard)."""
    return (Path(path) / METADATA).is_file()


def snapshot_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def newest_snapshot(root: str | Path) -> int | None:
    """The newest complete snapshot's step under a role's snapshot folder, or None."""
    root = Path(root)
    if not root.is_dir():
        return None
    steps = [int(p.name[5:]) for p in root.glob("step_*") if p.name[5:].isdigit() and complete(p)]
    return max(steps, default=None)


@dataclass
class Write:
    path: str
    future: Future


class AsyncSaver:
    """One rank's state writes in flight. Collective: every rank of the role makes the same calls."""

    def __init__(self):
        self.group = dist.new_group(backend="gloo")  # DCP's own collectives, apart from training's
        self.writes: list[Write] = []
        self.snapshot_root: str | None = None

    def save(self, model: nn.Module, optimizer: Optimizer, path: str) -> None:
        """Start writing model + optimizer to `path`; returns once the state is staged."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self.wait()  # one write at a time, so every rank's DCP collectives come in the same order
        msd, osd = get_state_dict(model, optimizer)
        future = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=path, process_group=self.group)
        self.writes.append(Write(path, future))

    def snapshot(self, model: nn.Module, optimizer: Optimizer, step: int) -> None:
        """Start the per-step snapshot of trained step `step` (when snapshots are on)."""
        if self.snapshot_root is not None:
            self.save(model, optimizer, str(snapshot_dir(self.snapshot_root, step)))

    def wait(self) -> list[str]:
        """Wait for every write in flight; returns the paths written. A failed write raises."""
        done = []
        while self.writes:
            write = self.writes.pop(0)
            write.future.result()
            done.append(write.path)
        if done and self.snapshot_root is not None and dist.get_rank() == 0:
            self.prune_snapshots()
        return done

    def prune_snapshots(self) -> None:
        root = Path(self.snapshot_root)
        steps = sorted(int(p.name[5:]) for p in root.glob("step_*") if p.name[5:].isdigit())
        newest = newest_snapshot(root)
        for step in steps:
            if newest is not None and step < newest and step not in steps[-KEEP_SNAPSHOTS:]:
                shutil.rmtree(snapshot_dir(root, step), ignore_errors=True)

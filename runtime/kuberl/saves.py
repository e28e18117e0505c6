"""A trainable rank's state writes, asynchronous: periodic checkpoints (torch DCP) and per-step snapshots.

Checkpoints: a DCP `async_save` on the rank's own gloo group. The state is staged (copied) before the
call returns, so training goes on while a background thread writes it; `wait()` waits for every write
in flight. Writes run one at a time, in the order they were started, so the ranks' collectives inside
DCP always meet. DCP writes a folder's `.metadata` last, after every rank's shards: a folder without it
is torn and is never loaded.

Snapshots: after every update, each rank copies its own shards (parameters and optimizer state, as
FSDP2 holds them) to host memory and a background thread writes them to one file per rank, renamed
into place when whole:

    <snapshots>/<role>/step_000007/rank_0.pt     rank 0's state after the role's 7th update (newest two kept)

No collective and no resharding: a memcpy and a file write, cheap enough for every step. A snapshot is
loaded only by a rank of the same rank in a group of the same world size (a restarted role), on
storage that outlived the old rank (the checkpoint volume, or local disk on one host), so a restarted
role resumes from its last completed step instead of the last periodic checkpoint.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

METADATA = ".metadata"
KEEP_SNAPSHOTS = 2


def complete(path: str | Path) -> bool:
    """Whether `path` holds a whole DCP checkpoint (its metadata is written after every shard)."""
    return (Path(path) / METADATA).is_file()


def snapshot_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def snapshot_file(root: str | Path, step: int, rank: int) -> Path:
    return snapshot_dir(root, step) / f"rank_{rank}.pt"


def newest_snapshot(root: str | Path, rank: int) -> int | None:
    """The newest step whose snapshot file of `rank` is whole (renamed into place) under `root`, or None."""
    root = Path(root)
    if not root.is_dir():
        return None
    steps = [int(p.name[5:]) for p in root.glob("step_*") if p.name[5:].isdigit() and (p / f"rank_{rank}.pt").is_file()]
    return max(steps, default=None)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def shard_tensors(model: nn.Module, optimizer: Optimizer) -> list[torch.Tensor]:
    """This rank's own tensors of the trainable state, in a fixed order: each parameter's local shard,
    then each parameter's optimizer state (keys sorted). The same order in every process of the role."""
    params = list(model.parameters())
    out = [_local(p) for p in params]
    for p in params:
        state = optimizer.state.get(p, {})
        out += [_local(state[k]) for k in sorted(state) if isinstance(state[k], torch.Tensor)]
    return out


class AsyncSaver:
    """One rank's state writes in flight. Collective for checkpoints: every rank of the role makes the
    same calls."""

    def __init__(self):
        self.group = dist.new_group(backend="gloo")  # DCP's own collectives, apart from training's
        self.rank = dist.get_rank()
        self.writes: list[tuple[str, Future]] = []
        self.snapshot_root: str | None = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kuberl-snapshot")

    def save(self, model: nn.Module, optimizer: Optimizer, path: str, trainable_only: bool = False) -> None:
        """Start writing a DCP checkpoint of model + optimizer to `path`; returns once the state is staged.
        `trainable_only`: the parameters that train (LoRA adapters) and not the frozen ones."""
        import torch.distributed.checkpoint as dcp

        from .checkpoint import trainable_state

        self.wait()  # one write at a time, so every rank's DCP collectives come in the same order
        state = trainable_state(model, optimizer, trainable_only)
        future = dcp.async_save(state, checkpoint_id=path, process_group=self.group)
        self.writes.append((path, future))

    def snapshot(self, model: nn.Module, optimizer: Optimizer, step: int) -> None:
        """Start the per-step snapshot of trained step `step` (when snapshots are on): this rank's shards
        are copied to host memory now and written to their file in the background."""
        if self.snapshot_root is None:
            return
        with torch.no_grad():
            staged = [t.detach().to("cpu", copy=True) for t in shard_tensors(model, optimizer)]
        path = snapshot_file(self.snapshot_root, step, self.rank)
        self.writes.append((str(path), self.pool.submit(_write, staged, path)))

    def load_snapshot(self, model: nn.Module, optimizer: Optimizer, step: int, init_state) -> None:
        """Load this rank's snapshot of step `step` in place. `init_state()` creates the optimizer state
        first when this rank has none yet (a fresh rank)."""
        self.wait()
        staged = torch.load(snapshot_file(self.snapshot_root, step, self.rank), weights_only=True)
        if not optimizer.state:
            init_state()
        live = shard_tensors(model, optimizer)
        if len(live) != len(staged) or any(a.shape != b.shape for a, b in zip(live, staged)):
            raise RuntimeError(f"snapshot of step {step} does not match this rank's state (another layout)")
        with torch.no_grad():
            for dst, src in zip(live, staged):
                dst.copy_(src)

    def wait(self) -> list[str]:
        """Wait for every write in flight; returns the paths written. A failed write raises."""
        done = []
        while self.writes:
            path, future = self.writes.pop(0)
            future.result()
            done.append(path)
        if done and self.snapshot_root is not None:
            self.prune_snapshots()
        return done

    def prune_snapshots(self) -> None:
        """Keep this rank's newest KEEP_SNAPSHOTS snapshot files; drop emptied step folders."""
        root = Path(self.snapshot_root)
        mine = sorted(int(p.parent.name[5:]) for p in root.glob(f"step_*/rank_{self.rank}.pt")
                      if p.parent.name[5:].isdigit())
        for step in mine[:-KEEP_SNAPSHOTS]:
            snapshot_file(root, step, self.rank).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                snapshot_dir(root, step).rmdir()  # the last rank out removes the folder


def _write(staged: list[torch.Tensor], path: Path) -> None:
    """Write a rank's staged tensors whole or not at all (a rename publishes them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(staged, tmp)
    os.replace(tmp, path)


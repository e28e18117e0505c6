"""A trainable rank's state writes, asynchronous: periodic checkpoints (torch DCP) and per-step snapshots.

Checkpoints: torch DCP on the rank's own gloo group, written by a background thread while training goes on;
`wait()` waits for every write in flight, `pending()` says whether one is. With snapshots on, a checkpoint of
trained step s is written from the snapshot slot that holds step s (`kuberl.resilience.snapshots`), once that copy is
whole: nothing is staged on the training path but the state dict's structure, and the slot is not rewritten (by the
snapshot of step s + 2) until the checkpoint is written. Without snapshots it is a DCP `async_save`, which copies
the state to host memory before it returns. Writes run one at a time, in the order they were started, so the
ranks' collectives inside DCP always meet; a save waits for the previous write's collectives only, not for its
fsyncs (a periodic save otherwise waited on the training path for the last one's disk). DCP writes a folder's
`.metadata` last, after every rank's shards: a folder without it is torn and is never loaded.

Snapshots (`kuberl.resilience.snapshots`): after every update, each rank copies its own shards (parameters and optimizer
state, as FSDP2 holds them) in a background thread into the one of its two slot files that does not hold the
newest whole snapshot. No collective and no resharding: a DMA or a memcpy, which overlaps the role's next
calls (the next step's rollout, values) and is waited for only by its next update. A role that dies before
the copy of update k is whole is restored from step k - 1 and runs update k again (`kuberl.library`). A
snapshot is loaded only by a rank of the same rank in a group of the same world size (a restarted role), on
storage that outlived the old rank (host memory or local disk on one host, or the checkpoint volume), so a
restarted role resumes from its last completed step instead of the last periodic checkpoint.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer
from torch.utils.serialization import config as serialization_config

from kuberl import logs
from kuberl.resilience import snapshots
from kuberl.resilience.snapshots import NoRoom, Unusable

log = logs.get("checkpoint")
METADATA = ".metadata"


def complete(path: str | Path) -> bool:
    """Whether `path` holds a whole DCP checkpoint (its metadata is written after every shard)."""
    return (Path(path) / METADATA).is_file()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t  # to_local() costs a dispatch per tensor


def shard_tensors(model: nn.Module, optimizer: Optimizer) -> list[torch.Tensor]:
    """This rank's own tensors of the trainable state, in a fixed order: each trainable parameter's local shard,
    then each one's optimizer state (keys sorted). The same order in every process of the role. Frozen
    parameters (LoRA's base weights) are not in it: a new rank builds them from the model path, unchanged."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = [_local(p) for p in params]
    for p in params:
        state = optimizer.state.get(p, {})
        out += [_local(state[k]) for k in sorted(state) if isinstance(state[k], torch.Tensor)]
    return out


def planned_shards(model: nn.Module, optimizer: Optimizer) -> list[torch.Tensor]:
    """`shard_tensors` as it will be once the optimizer has state: before the first step (no state yet), meta
    tensors shaped as AdamW's (`kuberl.training.kernels.optim`: exp_avg and exp_avg_sq like the parameter, step a
    float32 scalar), so that the slots can be set up for it (`SlotWriter.reserve`) while that step runs."""
    if optimizer.state:
        return shard_tensors(model, optimizer)
    params = [_local(p).detach() for p in model.parameters() if p.requires_grad]
    like = [torch.empty_like(p, device="meta") for p in params]
    step = [torch.empty((), dtype=torch.float32, device="meta") for _ in params]
    return like + [t for trio in zip(like, like, step) for t in trio]


def _key(t: torch.Tensor) -> tuple[int, torch.dtype, tuple[int, ...]]:
    return t.data_ptr(), t.dtype, tuple(t.shape)


@dataclass(frozen=True)
class SlotRef:
    """A state-dict entry whose bytes are the `index`-th tensor of a snapshot slot; `spec`: its DTensor layout."""

    index: int
    spec: Any = None


def plan_from_slot(state: Any, keys: dict[tuple[int, torch.dtype, tuple[int, ...]], int]) -> Any:
    """`state` (a DCP state dict of live tensors) with each tensor that is one of a snapshot's (by storage, dtype
    and shape: `keys`) replaced by a `SlotRef`, and any other tensor copied to host memory now."""
    if isinstance(state, dict):
        return {k: plan_from_slot(v, keys) for k, v in state.items()}
    if isinstance(state, list):
        return [plan_from_slot(v, keys) for v in state]
    if isinstance(state, DTensor):
        index = keys.get(_key(state._local_tensor))
        if index is not None:
            return SlotRef(index, state._spec)
        return DTensor(state._local_tensor.detach().to("cpu", copy=True), state._spec, requires_grad=False)
    if isinstance(state, torch.Tensor):
        index = keys.get(_key(state))
        return SlotRef(index) if index is not None else state.detach().to("cpu", copy=True)
    return state


def from_slot(plan: Any, views: list[torch.Tensor]) -> Any:
    """The state dict of `plan` with each `SlotRef` made a (DTensor over a) view into the slot's `views`."""
    if isinstance(plan, dict):
        return {k: from_slot(v, views) for k, v in plan.items()}
    if isinstance(plan, list):
        return [from_slot(v, views) for v in plan]
    if isinstance(plan, SlotRef):
        view = views[plan.index]
        return view if plan.spec is None else DTensor(view, plan.spec, requires_grad=False)
    return plan


@dataclass(frozen=True)
class Snap:
    """The newest snapshot started: its trained step, its copy, and its tensors' keys (`_key`) by slot order."""

    step: int
    future: Future
    keys: dict[tuple[int, torch.dtype, tuple[int, ...]], int]


class _CrcOff:
    """torch.save's CRC-32 off while any checkpoint write of this process runs: the setting is process-wide (a
    `torch.save` in another thread meanwhile skips it too), and two roles in one process write at once."""

    def __init__(self):
        self.lock, self.writes, self.saved = threading.Lock(), 0, True

    def __enter__(self) -> None:
        with self.lock:
            if self.writes == 0:
                self.saved = serialization_config.save.compute_crc32
                serialization_config.save.compute_crc32 = False
            self.writes += 1

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.writes -= 1
            if self.writes == 0:
                serialization_config.save.compute_crc32 = self.saved


_NO_CRC = _CrcOff()


class _Writer(FileSystemWriter):
    """DCP's file writer, its tensors serialised without a CRC-32 of their bytes: torch.load never checks it, and
    computing it made the write several times slower (bench/checkpoint_write.py)."""

    def write_data(self, plan: Any, planner: Any) -> Future:
        with _NO_CRC:
            return super().write_data(plan, planner)


def writer(path: str, sync: bool) -> FileSystemWriter:
    """DCP's file writer for host-memory tensors, without its copy-ahead: that loader synchronises the writing
    thread's CUDA stream every megabyte, which ties the write to the training kernels queued on the device. One
    writing thread: with more, DCP drops an exception raised in an extra thread and writes `.metadata` without
    that thread's items, a torn checkpoint that looks complete. `sync`: each file fsynced as it is written."""
    return _Writer(path, sync_files=sync, thread_count=1, per_thread_copy_ahead=0)


def fsync_tree(path: str | Path) -> None:
    """Flush every file under `path`, then the folder, to permanent storage."""
    folder = Path(path)
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_room(path: str | Path, nbytes: int) -> None:
    """Refuse a checkpoint write of `nbytes` that the filesystem under `path` has no room for (before any byte is
    written: a full disk mid-write shows up only as torch's zip writer losing its place)."""
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if nbytes > free:
        raise NoRoom(f"{nbytes / 2**30:.1f} GiB for this rank's checkpoint under {folder}, {free / 2**30:.1f} GiB "
                     f"free (free some, or lower spec.trainer.checkpoint.keep)")


def _cause(exc: BaseException, path: str) -> str:
    """`Type: first line` of the error behind a failed write (DCP wraps each rank's in a CheckpointException); a
    short write inside torch's zip writer ("unexpected pos") says how much room was left, its usual cause."""
    failures = exc.failures if isinstance(exc, CheckpointException) else {}
    inner = next(iter(failures.values()))[0] if failures else exc
    lines = str(inner).splitlines()
    cause = f"{type(inner).__name__}: {lines[0] if lines else ''}"
    if "unexpected pos" in cause:
        folder = Path(path)
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        cause += f"; a short write: {shutil.disk_usage(folder).free / 2**30:.1f} GiB free under {folder}"
    return cause


class AsyncSaver:
    """One rank's state writes in flight. Collective for checkpoints: every rank of the role makes the
    same calls."""

    def __init__(self):
        self.group = dist.new_group(backend="gloo")  # DCP's own collectives, apart from training's
        self.rank = dist.get_rank()
        self.writes: list[tuple[str, Future]] = []  # checkpoints
        self.snaps: list[tuple[str, Future]] = []  # snapshots
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kuberl-snapshot")
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kuberl-checkpoint")  # from a slot
        self.last: Snap | None = None  # the newest snapshot started
        self.collectives: Future | None = None  # done once the newest checkpoint write's DCP collectives are over
        self.staged_s = self.waited_s = 0.0  # seconds on the training path: snapshot staging, waits for copies
        self.copies_s: list[float] = []  # each snapshot copy's seconds in the background, from its start
        self.doom_next = False  # fault injection: the next snapshot write never ends (set by `Worker.execute`)
        self.doomed = False  # such a write is in flight: the rank is killed at its next call
        self._root: str | None = None
        self._slots: snapshots.SlotWriter | None = None

    @property
    def snapshot_root(self) -> str | None:
        """Where this rank's snapshots go (None: snapshots off)."""
        return self._root

    @snapshot_root.setter
    def snapshot_root(self, root: str | None) -> None:
        if root != self._root:
            self.wait()
            if self._slots is not None:
                self._slots.close()
            self._root, self._slots = root, snapshots.SlotWriter(root, self.rank) if root is not None else None
            self.last = None

    def reserve(self, model: nn.Module, optimizer: Optimizer) -> None:
        """Set up this rank's snapshot slots in the background, sized for the trainable state (when on)."""
        if self._slots is not None:
            planned = planned_shards(model, optimizer)
            self._slots.reserve(snapshots.slot_size(planned), any(p.is_cuda for p in model.parameters()))

    def save(self, model: nn.Module, optimizer: Optimizer, path: str, trainable_only: bool = False,
             step: int | None = None) -> None:
        """Start writing a DCP checkpoint of model + optimizer (trained step `step`) to `path`. From the
        snapshot of that step when there is one (`plan_from_slot`): nothing but the state dict's structure is
        made here. Otherwise staged (copied) before this returns. `trainable_only`: the parameters that train
        (LoRA adapters) and not the frozen ones. A snapshot copy in flight goes on (both only read the state)."""
        import torch.distributed.checkpoint as dcp

        from kuberl.resilience.checkpoint import trainable_state

        if self.collectives is not None:  # one write's collectives at a time, in the order the writes started, so
            futures.wait([self.collectives])  # that every rank's meet; a write's fsyncs go on meanwhile
        state = trainable_state(model, optimizer, trainable_only)
        last, slots = self.last, self._slots
        if slots is not None and last is not None and last.step == step:
            plan, released = plan_from_slot(state, last.keys), Future()
            slots.readers[step % snapshots.SLOTS] = (step, released)
            future = self.writer.submit(self._write_from_slot, slots, last, plan, path, released)
            self.collectives = released  # DCP's collectives are over once the slot is given back
        else:
            try:
                self._ready_everywhere(lambda: check_room(path, sum(t.nbytes for t in shard_tensors(model,
                                                                                                     optimizer))))
                future = dcp.async_save(state, storage_writer=writer(path, sync=True), process_group=self.group)
            except Exception as exc:  # void, with the warning `wait` gives any failed write
                future = Future()
                future.set_exception(exc)
            self.collectives = future
        self.writes.append((path, future))

    def _ready_everywhere(self, check: Callable[[], Any]) -> Any:
        """Run `check` (raising when this rank cannot write its part), then agree with every rank of the role: one
        that cannot makes them all give up, since DCP's collectives would wait for it forever."""
        try:
            out, ok = check(), 1
        except Exception as exc:  # any reason is raised again, once the other ranks know
            out, ok, problem = None, 0, exc
        flag = torch.tensor([ok])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        if not ok:
            raise problem
        if not int(flag.item()):
            raise Unusable("another rank of the role cannot write its part (its warning says why)")
        return out

    def _write_from_slot(self, slots: snapshots.SlotWriter, snap: Snap, plan: Any, path: str,
                         released: Future) -> None:
        """Write the checkpoint from the slot into the page cache, give the slot back (`released`), then make the
        files durable: a slow disk holds back the fsyncs, not the snapshot that rewrites the slot two steps on."""
        import torch.distributed.checkpoint as dcp

        def whole_and_room() -> list[torch.Tensor]:
            snap.future.result()  # the slot holds the step whole (Unusable: snapshots turned off on this rank)
            views = slots.views(snap.step)
            check_room(path, snapshots.slot_size(views))
            return views

        try:
            views = self._ready_everywhere(whole_and_room)
            dcp.save(from_slot(plan, views), storage_writer=writer(path, sync=False), process_group=self.group)
        finally:
            released.set_result(None)
        fsync_tree(path)

    def pending(self) -> bool:
        """Whether a checkpoint write is still in flight (`wait` would block)."""
        return any(not future.done() for _, future in self.writes)

    def snapshot(self, model: nn.Module, optimizer: Optimizer, step: int,
                 result: dict[str, float] | None = None) -> None:
        """Start the per-step snapshot of trained step `step` (when snapshots are on): this rank's shards are
        copied into a slot in the background, overlapping whatever the role does next; the next update
        waits for it first (`before_update`), since it changes them. After `doom_next` (fault injection) the
        copy never ends and the rank dies at its next call, its slot torn. `result`: what the update returned."""
        if self._slots is None:
            return
        t0 = time.perf_counter()
        tensors = [t.detach() for t in shard_tensors(model, optimizer)]
        ready = None
        if any(t.is_cuda for t in tensors):
            ready = torch.cuda.Event()
            ready.record()
        hold = threading.Event() if self.doom_next else None  # never set
        self.doomed, self.doom_next = self.doom_next, False
        path = str(snapshots.slot_file(self._root, self.rank, step % snapshots.SLOTS))
        future = self.pool.submit(self._write, tensors, step, ready, hold, result)
        self.snaps.append((path, future))
        self.last = Snap(step, future, {_key(t): i for i, t in enumerate(tensors) if t.numel()})
        self.staged_s += time.perf_counter() - t0

    def _write(self, tensors: list[torch.Tensor], step: int, ready: torch.cuda.Event | None,
               hold: threading.Event | None, result: dict[str, float] | None) -> None:
        t0 = time.perf_counter()
        self._slots.write(tensors, step, ready, hold, result)
        self.copies_s.append(time.perf_counter() - t0)

    def before_update(self) -> None:
        """Wait for the snapshot copy in flight: the update about to run changes the tensors it reads."""
        t0 = time.perf_counter()
        self.wait_snapshots()
        self.waited_s += time.perf_counter() - t0

    def load_snapshot(self, model: nn.Module, optimizer: Optimizer, step: int, init_state) -> dict[str, float] | None:
        """Load this rank's snapshot of step `step` in place; returns the result kept with it. `init_state()`
        creates the optimizer state first when this rank has none yet (a fresh rank)."""
        self.wait()
        if not optimizer.state:
            init_state()
        return snapshots.read_into(self._root, self.rank, step, shard_tensors(model, optimizer))

    def wait(self, snapshots: bool = True) -> list[str]:
        """Wait for every checkpoint write in flight and, with `snapshots`, every snapshot copy; returns the
        paths written. A failed checkpoint write is a one-line warning: its folder has no metadata, so it is
        never marked complete (`kuberl.library.Roles.commit` removes it); see `wait_snapshots` for snapshots."""
        done = []
        while self.writes:
            path, future = self.writes.pop(0)
            try:
                future.result()
            except (Exception, CheckpointException) as exc:  # DCP's is a BaseException; the supervisor voids it
                log.warning(f"checkpoint write to {path} failed on rank {self.rank} ({_cause(exc, path)}); that "
                            f"checkpoint is void (never marked complete) and training goes on",
                            extra={**logs.STDOUT, "rank": self.rank})
                continue
            done.append(path)
        return done + (self.wait_snapshots() if snapshots else [])

    def close(self) -> None:
        """Wait for every write, then unmap (and unpin) the slots: their bytes stay in the files."""
        self.wait()
        if self._slots is not None:
            self._slots.close()
        self.pool.shutdown()
        self.writer.shutdown()

    def wait_snapshots(self) -> list[str]:
        """Wait for the snapshot copies in flight; returns the slots written. One that finds no room (or an
        unsafe folder) turns snapshots off for this rank, with a warning (a restart then goes back to the last
        checkpoint); any other failure raises."""
        done = []
        while self.snaps:
            path, future = self.snaps.pop(0)
            try:
                future.result()
            except Unusable as exc:
                fix = "give the pod a larger /dev/shm" if isinstance(exc, NoRoom) else "fix that folder"
                log.warning(f"per-step snapshots off for rank {self.rank}: {exc} (a restart goes back to the last "
                            f"checkpoint; set spec.resilience.snapshots: off, or {fix})",
                            extra={**logs.STDOUT, "rank": self.rank})
                self._slots.drop()
                self._root = self._slots = None
                continue
            done.append(path)
        return done

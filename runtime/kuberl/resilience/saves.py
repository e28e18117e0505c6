"""A trainable rank's state writes, asynchronous: periodic checkpoints (torch DCP) and per-step snapshots.

Checkpoints: torch DCP on the rank's own gloo group, written by a background thread while training goes on;
`wait()` waits for every write in flight, `pending()` says whether one is. With snapshots on, a checkpoint of
trained step s is written from the snapshot slot that holds step s (`kuberl.resilience.snapshots`), once that copy is
whole: nothing is staged on the training path but the state dict's structure, and the slot is not rewritten
until the checkpoint is written. Without snapshots it is a DCP `async_save`, which copies the state to host
memory before it returns. Writes run one at a time on one thread, in the order they were started, so the ranks'
collectives inside DCP always meet; a save from a slot is queued behind the writes before it, and waits for
nothing on the training path (an `async_save` waits for the previous write's collectives). DCP writes a folder's
`.metadata` last, after every rank's shards: a folder without it is torn and is never loaded.

Snapshots (`kuberl.resilience.snapshots`): after every update, each rank copies its own shards (parameters and optimizer
state, as FSDP2 holds them) in a background thread into the one of its two slot files that does not hold the
newest whole snapshot. No collective and no resharding: a DMA or a memcpy, which overlaps the role's next
calls (the next step's rollout, values) and is waited for only by its next update. A role that dies before
the copy of update k is whole is restored from step k - 1 and runs update k again (`kuberl.library`).
While a checkpoint still reads the slot a snapshot would go to (a disk slower than two steps), the snapshot goes
to the other slot, and past REPLAY_WINDOW steps it is skipped, instead of waiting for the write (`snapshot_plan`):
a role that dies meanwhile comes back from the older snapshot the checkpoint reads and runs the updates since
again, at most REPLAY_WINDOW of them, which the driver keeps. The ranks of a role vote on which slots are read,
so they all choose the same and always hold a common whole snapshot. A
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
REPLAY_WINDOW = 8
"""The most updates a restarted role runs again on top of the snapshot it comes back from; the driver keeps that
many of each role's last updates (`kuberl.controller.role_state`), and a snapshot is skipped only within it."""


def snapshot_plan(step: int, in_slot: dict[int, int], held: set[int], window: int = REPLAY_WINDOW,
                  skip: bool = True) -> tuple[str, int]:
    """Where the snapshot of trained step `step` goes: ("write", slot) now, ("wait", slot) once the checkpoints
    reading that slot (`held`) are written, or ("skip", -1). `in_slot`: {slot: the step it holds whole}. Usually
    the slot without the newest snapshot; while a checkpoint reads that one, the newest's own slot (the read one,
    whole, is then what a restart comes back from). Whatever it does, some slot stays whole within `window`
    steps of `step` (the updates a restart runs again). `skip` False: a checkpoint needs this step's snapshot."""
    def fallback(slot: int) -> int | None:  # whole while `slot` is rewritten (None: none yet, the checkpoint)
        return max((s for other, s in in_slot.items() if other != slot), default=None)

    order = sorted(range(snapshots.SLOTS), key=lambda slot: (in_slot.get(slot, -1), slot != step % snapshots.SLOTS))
    for slot in order:  # the oldest first
        kept = fallback(slot)
        if slot not in held and (kept is None or step - kept <= window):
            return "write", slot
    if skip and in_slot and step - max(in_slot.values()) <= window:
        return "skip", -1
    return "wait", order[0]


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
    """The newest snapshot started: its trained step, its slot, its copy, and its tensors' keys (`_key`) by their
    order in the slot."""

    step: int
    slot: int
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
        self.votes = dist.new_group(backend="gloo") if dist.get_world_size() > 1 else None  # on held slots
        self.last: Snap | None = None  # the newest snapshot started
        self.in_slot: dict[int, int] = {}  # slot -> the step it holds whole once the write started into it ends
        self.skipped: tuple[int, dict[str, float] | None] | None = None  # the newest step whose snapshot was skipped
        self.skips = 0  # snapshots skipped so far (a checkpoint still read their slot)
        self.voting = False  # snapshots were turned on for the role: this rank votes at every update, slots or not
        self.collectives: Future | None = None  # done once the newest checkpoint write's DCP collectives are over
        self.staged_s = self.waited_s = 0.0  # seconds on the training path: snapshot staging, waits for copies
        self.copies_s: list[float] = []  # each snapshot copy's seconds in the background, from its start
        self.doom_next = False  # fault injection: the next snapshot write never ends (set by `Worker.execute`)
        self.doomed = False  # such a write is in flight: the rank is killed at its next call
        self.slow_next = 0.0  # fault injection: the next checkpoint write from a slot starts this many seconds late
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
            self.last, self.skipped, self.voting = None, None, root is not None
            self.in_slot = {} if root is None else self._on_disk()

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

        slots = self._slots
        held = self._held_everywhere(step) if self.voting else set()  # every rank votes at every save
        if slots is not None and self.skipped is not None and self.skipped[0] == step:
            _, slot = snapshot_plan(step, self.in_slot, held, REPLAY_WINDOW, skip=False)
            self._start(model, optimizer, *self.skipped, slot)  # copied once that slot is free: in the background
        state = trainable_state(model, optimizer, trainable_only)
        last = self.last
        if slots is not None and last is not None and last.step == step:
            plan, released, late = plan_from_slot(state, last.keys), Future(), self.slow_next
            slots.readers.setdefault(last.slot, []).append((step, released))
            self.slow_next = 0.0
            # queued behind the writes before it (one writing thread): every rank's DCP collectives meet in order
            future = self.writer.submit(self._write_from_slot, slots, last, plan, path, released, late)
            self.collectives = released  # DCP's collectives are over once the slot is given back
        else:
            if self.collectives is not None:  # this thread's collectives below must not meet a write's
                futures.wait([self.collectives])
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
                         released: Future, late: float = 0.0) -> None:
        """Write the checkpoint from the slot into the page cache, give the slot back (`released`), then make the
        files durable: a slow disk holds back the fsyncs, not the snapshot that rewrites the slot two steps on.
        `late`: seconds to wait first, holding the slot (fault injection: a disk slower than the steps)."""
        import torch.distributed.checkpoint as dcp

        def whole_and_room() -> list[torch.Tensor]:
            snap.future.result()  # the slot holds the step whole (Unusable: snapshots turned off on this rank)
            views = slots.views(snap.step)
            check_room(path, snapshots.slot_size(views))
            return views

        try:
            time.sleep(late)
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
        waits for it first (`before_update`), since it changes them. The slot is the one `snapshot_plan` picks (or
        none: skipped) from the slots that checkpoints still read on any rank of the role (a vote). After
        `doom_next` (fault injection) the copy never ends and the rank dies at its next call, its slot torn.
        `result`: what the update returned."""
        if not self.voting:
            return
        plan, slot = snapshot_plan(step, self.in_slot, self._held_everywhere(step), REPLAY_WINDOW)
        if self._slots is None:  # turned off on this rank alone (no room): it still voted
            return
        if plan == "skip":
            self.skipped, self.skips = (step, result), self.skips + 1
            return
        self._start(model, optimizer, step, result, slot)

    def _held_everywhere(self, step: int) -> set[int]:
        """The slots that a checkpoint of a step before `step` still reads on this rank or any other of the role
        (a vote on the role's own gloo group: every rank then plans the same)."""
        readers = self._slots.readers if self._slots is not None else {}
        held = {slot for slot, reads in readers.items() if any(s < step and not r.done() for s, r in reads)}
        if self.votes is None:
            return held
        flags = torch.tensor([int(slot in held) for slot in range(snapshots.SLOTS)])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.votes)
        return {slot for slot in range(snapshots.SLOTS) if flags[slot]}

    def _start(self, model: nn.Module, optimizer: Optimizer, step: int, result: dict[str, float] | None,
               slot: int) -> None:
        t0 = time.perf_counter()
        tensors = [t.detach() for t in shard_tensors(model, optimizer)]
        ready = None
        if any(t.is_cuda for t in tensors):
            ready = torch.cuda.Event()
            ready.record()
        hold = threading.Event() if self.doom_next else None  # never set
        self.doomed, self.doom_next = self.doom_next, False
        path = str(snapshots.slot_file(self._root, self.rank, slot))
        future = self.pool.submit(self._write, tensors, step, slot, ready, hold, result)
        self.snaps.append((path, future))
        self.last = Snap(step, slot, future, {_key(t): i for i, t in enumerate(tensors) if t.numel()})
        self.in_slot[slot], self.skipped = step, None
        self.staged_s += time.perf_counter() - t0

    def _write(self, tensors: list[torch.Tensor], step: int, slot: int, ready: torch.cuda.Event | None,
               hold: threading.Event | None, result: dict[str, float] | None) -> None:
        t0 = time.perf_counter()
        self._slots.write(tensors, step, ready, hold, result, slot)
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
        result = snapshots.read_into(self._root, self.rank, step, shard_tensors(model, optimizer))
        self.in_slot = self._on_disk()
        return result

    def _on_disk(self) -> dict[int, int]:
        """{slot: the step it holds whole} of this rank's slots under the snapshot root, as the files say."""
        return {slot: s for s, slot in snapshots.whole_steps(self._root, self.rank).items()}

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

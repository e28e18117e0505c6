"""Per-step snapshots of one rank's trainable state, in two alternating slot files that outlive the process.

    <root>/rank_0.slot0         rank 0's tensors as raw bytes, each at a 4 KiB-aligned offset
    <root>/rank_0.slot0.json    {"step": 7, "layout": [[dtype, shape, offset], ...], "result": {...}}: present
                                only while whole; "result" is what the update to that step returned

The snapshot of a trained step goes to the slot without the newest whole one (`saves.snapshot_plan`; slot s % 2
when nothing else decides), so that a whole one is there while it is written. A slot's
json is removed before its bytes are rewritten and written (renamed into place) once they are whole: a slot
without its json is torn and is never read. A reader checks the json again after copying, since a warm standby
may read a slot that its role starts to rewrite.

The slots are memory-mapped files, written in place: no serialisation and no second copy. On a GPU each slot
is page-locked once (`cudaHostRegister`) and filled with one asynchronous DMA per tensor on a side stream; the
root is then host memory (`/dev/shm`), since disks do not take gigabytes per step. On the CPU it is a memcpy
into the page cache of the checkpoint volume. Either way the bytes survive the death of the process that wrote
them (not of its host, or of its pod on Kubernetes unless the root is a volume the next pod mounts).

Both slots are set up (`reserve`) in the background while the role's first step runs, sized from the model
before the optimizer has state, so that the set-up (about 1 s per 8 GiB on an H200's host) stalls no step. A
periodic checkpoint is written from the slot of its step (`views`), which is not rewritten until that checkpoint
is written (`readers`).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ALIGN = 4096
SLOTS = 2
CHUNK_BYTES = 64 << 20  # the most a GPU slot copy queues at once: the training stream's own small copies (a loss
# read back, a weight sync) then wait behind one chunk, not behind gigabytes of state
PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every CUDA context, whichever device the thread has set
MEMORY_FS = ("tmpfs", "ramfs")  # its pages are charged to the writer's memory cgroup and never written back
LOCAL_FS = (*MEMORY_FS, "ext4", "ext3", "xfs", "btrfs", "zfs", "f2fs", "overlay")  # one page cache for the host


def slot_file(root: str | Path, rank: int, slot: int) -> Path:
    return Path(root) / f"rank_{rank}.slot{slot}"


def _meta_file(root: str | Path, rank: int, slot: int) -> Path:
    return Path(root) / f"rank_{rank}.slot{slot}.json"


def _read_meta(root: str | Path, rank: int, slot: int) -> dict | None:
    try:
        return json.loads(_meta_file(root, rank, slot).read_text())
    except (FileNotFoundError, ValueError):
        return None


def whole_steps(root: str | Path, rank: int) -> dict[int, int]:
    """{trained step: slot} of `rank`'s whole snapshots under `root` (at most two)."""
    metas = {slot: _read_meta(root, rank, slot) for slot in range(SLOTS)}
    return {m["step"]: slot for slot, m in metas.items() if m is not None}


def newest(root: str | Path, rank: int) -> int | None:
    """The newest trained step whose snapshot of `rank` is whole under `root`, or None."""
    return max(whole_steps(root, rank), default=None)


@dataclass(frozen=True)
class Entry:
    dtype: str  # "float32", ...
    shape: tuple[int, ...]
    offset: int  # bytes from the slot's start
    nbytes: int

    @classmethod
    def read(cls, dtype: str, shape: list[int], offset: int) -> Entry:
        numel = 1
        for d in shape:
            numel *= d
        return cls(dtype, tuple(shape), offset, numel * torch.empty((), dtype=getattr(torch, dtype)).element_size())


def layout_of(tensors: list[torch.Tensor]) -> list[Entry]:
    """Where each tensor's bytes go in a slot, in order, each start aligned to ALIGN bytes."""
    out, offset = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        out.append(Entry(str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    return out


def _size(layout: list[Entry]) -> int:
    return max((e.offset + e.nbytes for e in layout), default=0) or ALIGN


def slot_size(tensors: list[torch.Tensor]) -> int:
    """Bytes of one slot holding `tensors` (meta tensors will do: only shapes and dtypes are read)."""
    return _size(layout_of(tensors))


def _views(buf: torch.Tensor, layout: list[Entry]) -> list[torch.Tensor]:
    """Typed views, each of the layout's shape, into the flat uint8 buffer `buf`. Each has a storage of its own
    bytes only (a slice of `buf`'s, sharing its memory): a checkpoint writer copies a tensor whose storage is
    larger than the tensor before it writes it (torch DCP's loader), which for a view into the whole slot was a
    second copy of the state, in fresh memory."""
    storage = buf.untyped_storage()
    return [torch.empty(0, dtype=getattr(torch, e.dtype)).set_(storage[e.offset:e.offset + e.nbytes], 0, e.shape)
            for e in layout]


class Unusable(OSError):
    """Snapshots cannot be kept where they were asked for; the rank goes on without them."""


class NoRoom(Unusable):
    """The slots do not fit where they go (a small /dev/shm, a full disk, the pod's memory limit)."""


class NotPrivate(Unusable):
    """A folder on the slots' path is another user's, a link, or writable by others."""


def fs_type(path: Path) -> str:
    """The type of the filesystem `path` is on (the longest mount point of /proc/mounts above it), or ""."""
    best, kind = "", ""
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            point = fields[1].replace("\\040", " ")
            if len(point) > len(best) and (str(path) == point or str(path).startswith(point.rstrip("/") + "/")):
                best, kind = point, fields[2]
    return kind


def memory_cgroup_room() -> int | None:
    """Bytes this process's memory cgroup (v2) may still charge, or None without a limit."""
    try:
        with open("/proc/self/cgroup") as groups:
            rel = next(line[3:].strip() for line in groups if line.startswith("0::"))
        base = Path("/sys/fs/cgroup") / rel.lstrip("/")
        limit = (base / "memory.max").read_text().strip()
        return None if limit == "max" else int(limit) - int((base / "memory.current").read_text())
    except (OSError, StopIteration, ValueError):
        return None


def private_dir(root: Path, levels: int = 3) -> None:
    """Create `root` and its missing parents as this user's own folders (mode 0700), and check its last
    `levels` folders: each a real folder of this user that no one else may write. /dev/shm is shared by every
    local user, who could otherwise plant a slot there or read one."""
    missing, d = [], root
    while not os.path.lexists(d):
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            pass  # made meanwhile (another rank): checked below
    for d in [root, *root.parents][:levels]:
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise NotPrivate(f"{d} is not a folder of this user that only it can write: remove it")


class SlotWriter:
    """One rank's two slots under `root`, mapped once and (on a GPU) page-locked once; `write` fills one."""

    def __init__(self, root: str | Path, rank: int):
        self.root, self.rank = Path(root), rank
        self.fs = ""  # the root's filesystem type, once it exists
        self.bufs: dict[int, torch.Tensor] = {}
        self.registered: set[int] = set()
        self.stream = None
        self.readers: dict[int, list[tuple[int, Future]]] = {}  # slot -> [(a step, done once a checkpoint of that
        # step has read it: `kuberl.resilience.saves`)]; a later step's write waits for them, the step's own does not
        self._reserving: Future | None = None

    def reserve(self, size: int, cuda: bool) -> None:
        """Set up both slots for `size` bytes each in the background: allocated, mapped and (`cuda`) page-locked,
        about 1 s per 8 GiB on an H200's host (bench/pinning.py), so that the set-up overlaps the first step
        instead of the second one's update. The first `write` waits for it; a failure (no room) is raised there."""
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kuberl-slots")
        self._reserving = pool.submit(lambda: [self._buffer(slot, size, cuda) for slot in range(SLOTS)])
        pool.shutdown(wait=False)

    def views(self, step: int) -> list[torch.Tensor]:
        """Typed views into the slot that holds the whole snapshot of trained step `step` (just written by this
        writer), in the order the tensors were written."""
        slot = whole_steps(self.root, self.rank).get(step)
        meta = _read_meta(self.root, self.rank, slot) if slot is not None else None
        if meta is None or slot not in self.bufs:
            raise FileNotFoundError(f"no whole snapshot of step {step} for rank {self.rank} under {self.root}")
        return _views(self.bufs[slot], [Entry.read(d, s, o) for d, s, o in meta["layout"]])

    def _buffer(self, slot: int, size: int, cuda: bool) -> torch.Tensor:
        buf = self.bufs.get(slot)
        if buf is None or buf.numel() < size:
            self._release(slot)
            path = slot_file(self.root, self.rank, slot)
            private_dir(self.root)
            self.fs = self.fs or fs_type(self.root.resolve())
            self._check_room(size)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)  # ENOSPC here, not SIGBUS on a later write into the map
            except OSError as exc:
                path.unlink(missing_ok=True)
                raise NoRoom(f"{size * SLOTS / 2**30:.1f} GiB for two snapshot slots under {self.root}: "
                             f"{exc.strerror}") from None
            finally:
                os.close(fd)
            buf = self.bufs[slot] = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
        if cuda and slot not in self.registered:
            err = torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), buf.numel(), PORTABLE)
            if int(err) == 0:
                self.registered.add(slot)  # else pageable: the copies below are then synchronous, still correct
        return buf

    def _check_room(self, size: int) -> None:
        """Refuse a slot that would not fit: the filesystem's free space and, in memory (tmpfs), what the
        memory cgroup may still charge less a margin for the working set (past it the kernel would kill the
        rank instead of refusing the allocation)."""
        fs = os.statvfs(self.root)
        free = fs.f_bavail * fs.f_frsize
        if self.fs in MEMORY_FS and (room := memory_cgroup_room()) is not None:
            free = min(free, room - max(2**30, room // 10))
        if size > free:
            raise NoRoom(f"{size * SLOTS / 2**30:.1f} GiB for two snapshot slots under {self.root} "
                         f"({max(free, 0) / 2**30:.1f} GiB free)")

    def write(self, tensors: list[torch.Tensor], step: int, ready: torch.cuda.Event | None = None,
              hold: threading.Event | None = None, result: dict[str, float] | None = None,
              slot: int | None = None) -> None:
        """Copy `tensors` (this rank's state after trained step `step`) into `slot` (default step % SLOTS; the
        caller picks one that does not hold the only whole snapshot it needs: `saves.snapshot_plan`) and mark it
        whole, once no checkpoint of an older step reads that slot any more.
        Blocking; run it off the training thread. `ready`: recorded on the training stream once the tensors
        hold that step's values (GPU tensors are copied on a side stream that waits for it). `hold`: waited
        for before the slot is marked whole (fault injection: a rank that dies in the middle of a write).
        `result`: what the update to that step returned, kept with it (`read_into` gives it back)."""
        slot = step % SLOTS if slot is None else slot
        reserving, self._reserving = self._reserving, None
        if reserving is not None:
            reserving.result()  # the slots set up in the background (NoRoom raised here)
        older = [reader for held, reader in self.readers.get(slot, []) if held < step]
        futures.wait(older)  # the checkpoints of older steps in this slot that still read it
        self.readers[slot] = [(held, reader) for held, reader in self.readers.get(slot, []) if held >= step]
        _meta_file(self.root, self.rank, slot).unlink(missing_ok=True)  # torn from here until the rename below
        layout = layout_of(tensors)
        cuda = any(t.is_cuda for t in tensors)
        for other in range(SLOTS):  # both slots at the first write: their one-time set-up lands on one step
            self._buffer(other, _size(layout), cuda)
        self._copy_in(_views(self.bufs[slot], layout), tensors, slot, ready)
        if self.fs not in LOCAL_FS:  # a network filesystem: another node reads the server's bytes, not our cache
            fd = os.open(slot_file(self.root, self.rank, slot), os.O_RDWR | os.O_NOFOLLOW)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        if hold is not None:
            hold.wait()
        self._mark_whole(slot, {"step": step, "layout": [[e.dtype, list(e.shape), e.offset] for e in layout],
                                "result": result})

    def _copy_in(self, views: list[torch.Tensor], tensors: list[torch.Tensor], slot: int,
                 ready: torch.cuda.Event | None) -> None:
        """Copy `tensors` into the slot's `views`: from the GPU on the side stream once `ready`, in chunks of
        CHUNK_BYTES (non-blocking where the slot is page-locked), else on this thread. Returns once all landed."""
        if not any(t.is_cuda for t in tensors):
            for dst, src in zip(views, tensors):
                dst.copy_(src)
            return
        self.stream = self.stream or torch.cuda.Stream(device=next(t.device for t in tensors if t.is_cuda))
        with torch.cuda.stream(self.stream):
            if ready is not None:
                self.stream.wait_event(ready)
            queued = 0
            for dst, src in zip(views, tensors):
                dst.copy_(src, non_blocking=slot in self.registered)
                queued += src.nbytes
                if queued >= CHUNK_BYTES:
                    self.stream.synchronize()
                    queued = 0
        self.stream.synchronize()

    def _mark_whole(self, slot: int, meta: dict[str, Any]) -> None:
        """Write the slot's metadata beside it, then rename it into place: from then on the slot is whole.
        NoRoom on a full disk (the slot then stays torn)."""
        tmp = _meta_file(self.root, self.rank, slot).with_suffix(".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(meta))
        except OSError as exc:  # a full disk (the slots beside the checkpoints): this slot stays torn
            tmp.unlink(missing_ok=True)
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise NoRoom(f"no room to mark the snapshot of step {meta['step']} whole under {self.root}: "
                         f"{exc.strerror}") from None
        os.replace(tmp, _meta_file(self.root, self.rank, slot))

    def _release(self, slot: int) -> None:
        buf = self.bufs.pop(slot, None)
        if buf is not None and slot in self.registered:
            self.registered.discard(slot)
            torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())

    def close(self) -> None:
        if self._reserving is not None:  # a set-up in flight finishes first, so that none of it outlives this
            futures.wait([self._reserving])
            self._reserving = None
        for slot in list(self.bufs):
            self._release(slot)

    def drop(self) -> None:
        """Close, and remove this rank's slots: none of them is loaded any more."""
        self.close()
        for slot in range(SLOTS):
            _meta_file(self.root, self.rank, slot).unlink(missing_ok=True)
            slot_file(self.root, self.rank, slot).unlink(missing_ok=True)


def read_into(root: str | Path, rank: int, step: int, live: list[torch.Tensor]) -> dict[str, float] | None:
    """Copy `rank`'s whole snapshot of trained step `step` under `root` into `live` (the same tensors, in the
    same order, as were written); returns the result kept with it (None: none was). FileNotFoundError when that
    step has no whole snapshot (never written, or overwritten by a later step's while this copied); RuntimeError
    when its layout is not `live`'s."""
    slot = whole_steps(root, rank).get(step)
    if slot is None:
        raise FileNotFoundError(f"no whole snapshot of step {step} for rank {rank} under {root}")
    meta = _read_meta(root, rank, slot)
    layout = [Entry.read(d, s, o) for d, s, o in meta["layout"]] if meta else []
    if [(e.dtype, e.shape) for e in layout] != [(str(t.dtype).removeprefix("torch."), tuple(t.shape)) for t in live]:
        raise RuntimeError(f"snapshot of step {step} does not match this rank's state (another layout)")
    buf = torch.from_file(str(slot_file(root, rank, slot)), shared=False, size=_size(layout), dtype=torch.uint8)
    with torch.no_grad():
        for dst, src in zip(live, _views(buf, layout)):
            dst.copy_(src)
    if whole_steps(root, rank).get(step) != slot:
        raise FileNotFoundError(f"snapshot of step {step} for rank {rank} was overwritten while it was read")
    return meta.get("result") if meta else None

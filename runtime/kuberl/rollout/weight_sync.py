"""Weight sync from the actor's process to vLLM's workers: one staging buffer shared by CUDA IPC.

The actor (`StagedSender`) copies the weights, cast to the engine's dtype, into one flat buffer on its GPU,
bucket by bucket; each vLLM worker (`vllm_worker.KuberlWorkerExtension`) maps that buffer once
(cudaIpcOpenMemHandle, through torch's own reduce/rebuild of CUDA tensors) and loads views of it into its
model. The wire format below is what crosses the process boundary: plain msgpack data (bytes, ints,
strings, lists), because vLLM encodes the arguments of `LLM.collective_rpc` with msgpack in its default
multiprocessing mode, where a tensor arrives as a list and Python objects (dtypes, classes) are refused
unless pickling is allowed (VLLM_ALLOW_INSECURE_SERIALIZATION). When vLLM runs its worker in the actor's
own process (VLLM_ENABLE_V1_MULTIPROCESSING=0) nothing is encoded and IPC could not map the process's own
memory anyway: the buffer itself is passed (`BufferRef.tensor`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any, TypedDict

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

ALIGN = 64  # elements: every weight starts on a 128-byte boundary (bf16)


class BufferRef(TypedDict, total=False):
    """How a worker finds the staging buffer: `tensor` in-process; otherwise the GPU and the IPC fields."""
    pid: int
    tensor: torch.Tensor    # in-process only
    device_uuid: str
    dtype: str
    ipc: list[Any]          # reduce_tensor's fields for a CUDA tensor, classes dropped and the dtype as text


# one entry per weight of a bucket: (HF name, element offset in the staging buffer, shape)
StagedEntry = tuple[str, int, list[int]]
Rpc = Callable[..., list]  # LLM.collective_rpc(method, args=(...)) -> one result per worker


def device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def export_buffer(buf: torch.Tensor, in_process: bool) -> BufferRef:
    """A reference to the contiguous tensor `buf` that a worker can open (CUDA IPC unless in-process)."""
    if in_process:
        return {"pid": os.getpid(), "tensor": buf}
    _, fields = reduce_tensor(buf)
    # fields: tensor class, size, stride, offset, storage class, dtype, device, handle, storage bytes,
    # storage offset, requires_grad, ref-counter handle, ref-counter offset, event handle, event sync required
    ipc = [list(fields[1]), list(fields[2]), int(fields[3]), bytes(fields[7]), int(fields[8]), int(fields[9]),
           bytes(fields[11]), int(fields[12]), bytes(fields[13]), bool(fields[14])]
    return {"pid": os.getpid(), "device_uuid": device_uuid(buf.device.index),
            "dtype": str(buf.dtype).removeprefix("torch."), "ipc": ipc}


def local_index(uuid: str) -> int | None:
    """This process's index of the GPU with that UUID, or None if it does not see it."""
    for i in range(torch.cuda.device_count()):
        if device_uuid(i) == uuid:
            return i
    return None


def import_buffer(ref: BufferRef) -> torch.Tensor:
    """Open the staging buffer named by `ref` in this process (in-process: the tensor itself)."""
    if "tensor" in ref:
        return ref["tensor"]
    index = local_index(ref["device_uuid"])
    if index is None:
        raise RuntimeError(f"weight sync: this vLLM worker does not see the actor's GPU {ref['device_uuid']} "
                           "(CUDA IPC needs the engine on the actor's GPU)")
    size, stride, offset, handle, storage_bytes, storage_offset, rc_handle, rc_offset, event, sync = ref["ipc"]
    return rebuild_cuda_tensor(torch.Tensor, torch.Size(size), tuple(stride), offset, torch.storage.TypedStorage,
                               getattr(torch, ref["dtype"]), index, handle, storage_bytes, storage_offset, False,
                               rc_handle, rc_offset, event, sync)


def _span(shape: list[int] | tuple[int, ...]) -> int:
    return -(-math.prod(shape) // ALIGN) * ALIGN


def plan_buckets(shapes: list[tuple[str, tuple[int, ...]]], bucket_elems: int) -> list[list[StagedEntry]]:
    """Group weights (name, shape), in order, into buckets of at most `bucket_elems` elements (a larger
    weight gets a bucket of its own); offsets are aligned to ALIGN elements."""
    buckets: list[list[StagedEntry]] = [[]]
    used = 0
    for name, shape in shapes:
        if buckets[-1] and used + _span(shape) > bucket_elems:
            buckets.append([])
            used = 0
        buckets[-1].append((name, used, list(shape)))
        used += _span(shape)
    return [b for b in buckets if b]


def staging_elems(buckets: list[list[StagedEntry]]) -> int:
    """Staging buffer length (elements) that holds the largest bucket."""
    return max(off + _span(shape) for _, off, shape in (b[-1] for b in buckets))


class StagedSender:
    """The actor's side: owns the staging buffer and drives the workers through `rpc` (collective_rpc).

    `expected` are the engine's parameter names that one full sync must write (a missing one is an error)."""

    def __init__(self, rpc: Rpc, device: torch.device, dtype: torch.dtype, in_process: bool, expected: set[str],
                 bucket_bytes: int):
        self.rpc, self.device, self.dtype, self.in_process = rpc, device, dtype, in_process
        self.expected, self.bucket_elems = expected, bucket_bytes // dtype.itemsize
        self.staging: torch.Tensor | None = None
        self._plan: tuple[tuple, list[list[StagedEntry]]] | None = None

    def _buckets(self, weights: list[tuple[str, torch.Tensor]]) -> list[list[StagedEntry]]:
        signature = tuple((n, tuple(t.shape)) for n, t in weights)
        if self._plan is None or self._plan[0] != signature:
            self._plan = (signature, plan_buckets(list(signature), self.bucket_elems))
        return self._plan[1]

    def _staging_for(self, elems: int) -> torch.Tensor:
        if self.staging is None or self.staging.numel() < elems:
            self.staging = None  # free the old one first
            self.staging = torch.empty(elems, dtype=self.dtype, device=self.device)
            self.rpc("kuberl_open_staging", args=(export_buffer(self.staging, self.in_process),))
        return self.staging

    @torch.no_grad()
    def send(self, state_dict: dict[str, torch.Tensor]) -> dict[str, float]:
        """Write every weight (HF names, any dtype and device) into the engine; returns timings and sizes."""
        t0 = time.perf_counter()
        seen: set[int] = set()
        weights = []
        for name, value in state_dict.items():  # tied weights (one tensor under two names) travel once
            if value.data_ptr() not in seen:
                seen.add(value.data_ptr())
                weights.append((name, value.detach()))
        by_name = dict(weights)
        buckets = self._buckets(weights)
        staging = self._staging_for(staging_elems(buckets))
        loaded: set[str] = set()
        for bucket in buckets:
            for name, off, _ in bucket:
                t = by_name[name]
                staging[off:off + t.numel()].copy_(t.reshape(-1), non_blocking=True)
            if staging.is_cuda:
                torch.cuda.synchronize(staging.device)  # the engine reads it from another process or stream
            for names in self.rpc("kuberl_load_staged", args=(bucket,)):
                loaded.update(names)
        missing = self.expected - loaded
        if missing:
            raise RuntimeError(f"vllm weight sync: {len(missing)} engine parameters were not written, e.g. "
                               f"{sorted(missing)[:3]} (the state dict lacks them)")
        return {"copy_and_load_s": time.perf_counter() - t0, "buckets": len(buckets),
                "bytes": sum(t.numel() for _, t in weights) * self.dtype.itemsize}

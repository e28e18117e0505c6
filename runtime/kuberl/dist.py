"""torch.distributed helpers: join a role's process group, FSDP2 sharding, device selection."""

from __future__ import annotations

import os
import socket
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from .models import transformer_blocks


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def init_group(rank: int, world_size: int, addr: str, port: int, device: torch.device) -> None:
    """Join this role's process group: gloo on CPU, NCCL on CUDA. Idempotent within a process."""
    if dist.is_initialized():
        return
    if addr.startswith("127."):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world_size, **kwargs)


def mesh_for(device: torch.device) -> DeviceMesh:
    return init_device_mesh(device.type, (dist.get_world_size(),))


def shard(model: nn.Module, device: torch.device, dtype: torch.dtype, mesh: Optional[DeviceMesh] = None) -> nn.Module:
    """FSDP2: shard each transformer block, then the root. bf16 compute keeps fp32 master weights."""
    mesh = mesh or mesh_for(device)
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype != torch.float32 else MixedPrecisionPolicy()
    model.to(device)
    for block in transformer_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum a small tensor across the group (a no-op copy at world size 1)."""
    out = values.clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(out)
    return out


def pick_device(gpus: int, requested: str = "auto") -> torch.device:
    if requested == "cpu" or (requested == "auto" and (gpus == 0 or not torch.cuda.is_available())):
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_initialized() else 0)


def measure_matmul_flops(device: torch.device, dtype: torch.dtype, n: int = 0, seconds: float = 0.5) -> float:
    """Achieved FLOP/s of square matmuls (2·n³ each) on `device` in `dtype`: the MFU peak used here.

    A measured peak, not a datasheet number: on an H200 bf16 this is ~790 TFLOP/s; on CPU fp32 it is
    whatever the cores give this process.
    """
    import time

    n = n or (8192 if device.type == "cuda" else 512)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    iters, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(5):
            a @ b
        iters += 5
        sync()
    return 2 * n**3 * iters / (time.perf_counter() - t0)

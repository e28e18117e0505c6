"""torch.distributed helpers: join a role's process group, FSDP2 sharding, device selection."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from kuberl.training.models import transformer_blocks


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listener(host: str) -> socket.socket:
    """A listening TCP socket on `host` (this pod's or host's own address, or 127.0.0.1) and a free port:
    rank 0 hands it to the group's store, which then listens there and not on every interface."""
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.bind((host, 0))
    s.listen()
    return s


def init_group(rank: int, world_size: int, addr: str, port: int, device: torch.device,
               listen: socket.socket | None = None, timeout_s: float | None = None) -> None:
    """Join this role's process group: gloo on CPU, NCCL on CUDA. Idempotent within a process. Rank 0
    serves the group's store on `listen` (see `listener`), the socket `addr:port` names.
    `timeout_s`: how long a collective (and the rendezvous) may wait for a peer; shorter than the
    driver's call timeout, so a rank stuck in a collective fails with the collective's error first."""
    if dist.is_initialized():
        return
    if addr.startswith("127."):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict = {"device_id": device} if device.type == "cuda" else {}
    if timeout_s is not None:
        kwargs["timeout"] = timedelta(seconds=timeout_s)
    if world_size == 1:  # nobody to meet: an in-process store, no TCP rendezvous (and no c10d socket warnings)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **kwargs)
        return
    store = dist.TCPStore(addr, port, world_size, is_master=rank == 0, wait_for_workers=False,
                          master_listen_fd=listen.fileno() if rank == 0 and listen is not None else None,
                          **({"timeout": kwargs["timeout"]} if "timeout" in kwargs else {}))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, **kwargs)


def mesh_for(device: torch.device) -> DeviceMesh:
    return init_device_mesh(device.type, (dist.get_world_size(),))


def shard(model: nn.Module, device: torch.device, dtype: torch.dtype, mesh: DeviceMesh | None = None,
          compile_blocks: bool = False, offload_params: bool = False,
          reshard_after_forward: bool | None = None) -> nn.Module:
    """FSDP2: shard each transformer block, then the root. bf16 compute keeps fp32 master weights
    (param_dtype bf16, reduce_dtype fp32).

    On CUDA at world size 1 nothing is actually sharded, so per-block units would only add hooks and
    small copies: the whole model is one FSDP unit there, gathered once (to bf16) per forward and
    kept until backward. With `compile_blocks` (`KernelOptions.compile_blocks`) every block's
    forward goes through torch.compile, after sharding (FSDP's hooks stay outside the compiled region;
    parameter names are unchanged); blocks share one compiled graph, so this costs one compilation,
    not one per layer.

    `offload_params`: FSDP2's `CPUOffloadPolicy` (sharded parameters, their gradients and so the
    optimizer step on the CPU, pinned on CUDA); every block is then its own unit at any world size, so
    only one block's parameters are on the GPU at a time. `reshard_after_forward` overrides the
    default (true, except for the single unit at world size 1).
    """
    mesh = mesh or mesh_for(device)
    mp = MixedPrecisionPolicy()
    if dtype != torch.float32:
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    single = device.type == "cuda" and mesh.size() == 1 and not offload_params
    reshard = not single if reshard_after_forward is None else reshard_after_forward
    policy = CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload_params else OffloadPolicy()
    model.to(device)
    blocks = transformer_blocks(model)
    if not single:
        for block in blocks:
            fully_shard(block, mesh=mesh, mp_policy=mp, offload_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=policy, reshard_after_forward=reshard)
    if compile_blocks:
        # one code object (the block class's forward) serves every role in the process, each with its
        # own variants (grad or not, train or eval, mask or none, trunk or causal LM): the default
        # limit of 8 compiled variants would silently send later ones back to eager
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        for block in blocks:
            block.compile()
    return model


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum a small tensor across the group (a no-op copy at world size 1)."""
    out = values.clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(out)
    return out


def all_reduce_max(values: torch.Tensor) -> torch.Tensor:
    """The elementwise maximum of a small tensor across the group (a no-op copy at world size 1)."""
    out = values.clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return out


def pick_device(gpus: int, requested: str = "auto") -> torch.device:
    if requested == "cpu" or (requested == "auto" and (gpus == 0 or not torch.cuda.is_available())):
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_initialized() else 0)


def measure_matmul_flops(device: torch.device, dtype: torch.dtype, n: int = 0, seconds: float = 0.5) -> float:
    """Achieved FLOP/s of square matmuls (2·n³ each) on `device` in `dtype`: the MFU peak used here.

    A measured peak, not a datasheet number: on an H200 bf16 it was ~790 TFLOP/s on some machines
    and 653-677 on a power-capped one (docs/performance.md); on CPU fp32 it is whatever the cores give
    this process.
    """
    import time

    n = n or (8192 if device.type == "cuda" else 512)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    # warm up for a while, not a few calls, so that clocks and power state settle before timing
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < min(seconds, 0.5):
        for _ in range(5):
            a @ b
        sync()
    iters, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(5):
            a @ b
        iters += 5
        sync()
    return 2 * n**3 * iters / (time.perf_counter() - t0)

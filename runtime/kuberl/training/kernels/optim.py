"""Optimiser kernels on FSDP2's local shards: gradient clipping and the fused AdamW step without DTensor
dispatch over hundreds of tensors, and an AdamW that uses them where it can."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from kuberl.training import dist as kdist

log = logging.getLogger(__name__)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2 parameters, gradients, optimizer state), or the tensor."""
    return t._local_tensor if isinstance(t, DTensor) else t


def clip_grad_norm_local(params, max_norm: float) -> torch.Tensor:
    """`clip_grad_norm_` (L2) computed on the local shards: FSDP2 shards every parameter along dim 0
    (disjoint pieces), so the global squared norm is the all-reduced sum of the local ones. Same
    result as on the DTensors, without DTensor dispatch over hundreds of tensors."""
    grads = [_local(p.grad) for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    sq = torch.stack(torch._foreach_norm(grads)).float().square().sum()
    if kdist.dist.is_initialized() and kdist.dist.get_world_size() > 1:
        on = sq.device
        if kdist.dist.get_backend() == "nccl" and on.type == "cpu":  # CPU-offloaded gradients: NCCL needs CUDA
            sq = sq.cuda()
        kdist.dist.all_reduce(sq)
        sq = sq.to(on)
    total = sq.sqrt()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(grads, coef.to(grads[0].dtype))
    return total


@torch.no_grad()
def fused_adamw_step_local(opt: torch.optim.Optimizer) -> None:
    """One AdamW step of a `fused=True` torch AdamW, run by the same fused kernel on the local shards.

    The state is kept exactly as torch's AdamW keeps it (step: a float32 tensor on the device;
    exp_avg / exp_avg_sq: like the parameter, DTensors under FSDP2), so checkpoints and
    `torch.optim.AdamW.step` remain interchangeable with this; only the DTensor dispatch is skipped.
    """
    for group in opt.param_groups:
        if group.get("amsgrad") or group.get("maximize") or group.get("differentiable"):
            raise NotImplementedError("local fused AdamW covers plain AdamW only")
        params, grads, avgs, sqs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            st = opt.state[p]
            if not st:
                st["step"] = torch.zeros((), dtype=torch.float32, device=_local(p).device)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            params.append(_local(p))
            grads.append(_local(p.grad))
            avgs.append(_local(st["exp_avg"]))
            sqs.append(_local(st["exp_avg_sq"]))
            steps.append(st["step"])
        if not params:
            continue
        torch._foreach_add_(steps, 1)
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        torch._fused_adamw_(params, grads, avgs, sqs, [], steps, lr=float(lr), beta1=beta1, beta2=beta2,
                            weight_decay=group["weight_decay"], eps=group["eps"], amsgrad=False, maximize=False,
                            grad_scale=None, found_inf=None)


def _host(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`t` with its local shard in CPU memory (copied to pinned memory if it is on a GPU), a DTensor
    placed like the parameter `like` when that is one."""
    local = _local(t)
    if local.device.type == "cpu" and (isinstance(t, DTensor) or not isinstance(like, DTensor)):
        return t
    if local.device.type != "cpu":
        local = torch.empty(local.shape, dtype=local.dtype, pin_memory=True).copy_(local)
    if isinstance(like, DTensor):  # not DTensor.from_local: it moves a CPU shard onto the mesh's device
        return DTensor(local, like._spec, requires_grad=False)
    return local


def _on_device(t: torch.Tensor, like: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` with its local shard on `device`, a DTensor placed like the parameter `like` when that is one."""
    local = _local(t)
    if local.device == device:
        return t
    local = local.to(device, non_blocking=True)
    return DTensor(local, like._spec, requires_grad=False) if isinstance(like, DTensor) else local


def move_adamw_state(opt: torch.optim.Optimizer, device: torch.device) -> None:
    """Move the AdamW moments that exist (a parameter not yet stepped has none) to `device`, or to pinned host
    memory when `device` is the CPU; `step` stays where it is."""
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p) or {}
            for key in ("exp_avg", "exp_avg_sq"):
                if key in st:
                    st[key] = _host(st[key], p) if device.type == "cpu" else _on_device(st[key], p, device)


def host_adamw_state(opt: torch.optim.Optimizer) -> None:
    """Create (zeros) or move every parameter's AdamW moments into CPU memory; `step` stays on the device."""
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state[p]
            if not st:
                st["step"] = torch.zeros((), dtype=torch.float32, device=_local(p).device)
                pin = _local(p).is_cuda
                st["exp_avg"] = torch.zeros(_local(p).shape, dtype=p.dtype, pin_memory=pin)
                st["exp_avg_sq"] = torch.zeros(_local(p).shape, dtype=p.dtype, pin_memory=pin)
            for key in ("exp_avg", "exp_avg_sq"):
                st[key] = _host(st[key], p)


@torch.no_grad()
def streamed_adamw_step(opt: torch.optim.Optimizer, chunk_elems: int = 1 << 27) -> None:
    """One fused AdamW step with the moments kept in CPU memory (optimizer-only offload, which FSDP2's
    CPUOffloadPolicy does not offer: it moves parameters, gradients and state together).

    Parameters and gradients stay on the device; per chunk of about `chunk_elems` elements (512 MiB of
    each fp32 moment) the moments are copied to the device, stepped by the same fused kernel as
    `fused_adamw_step_local`, and copied back, so the device holds one chunk of state at a time.
    Costs 16 bytes of host<->device traffic per fp32 parameter per step (not overlapped with compute).
    """
    host_adamw_state(opt)
    for group in opt.param_groups:
        chunk: list[torch.Tensor] = []
        size = 0
        for p in group["params"]:
            if p.grad is None:
                continue
            chunk.append(p)
            size += _local(p).numel()
            if size >= chunk_elems:
                _step_chunk(opt, group, chunk)
                chunk, size = [], 0
        if chunk:
            _step_chunk(opt, group, chunk)


def _step_chunk(opt: torch.optim.Optimizer, group: dict, chunk: list[torch.Tensor]) -> None:
    dev = _local(chunk[0]).device
    states = [opt.state[p] for p in chunk]
    host = [(_local(st["exp_avg"]), _local(st["exp_avg_sq"])) for st in states]
    avgs = [a.to(dev, non_blocking=True) for a, _ in host]
    sqs = [s.to(dev, non_blocking=True) for _, s in host]
    steps = [st["step"] for st in states]
    torch._foreach_add_(steps, 1)
    beta1, beta2 = group["betas"]
    torch._fused_adamw_([_local(p) for p in chunk], [_local(p.grad) for p in chunk], avgs, sqs, [], steps,
                        lr=float(group["lr"]), beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
                        eps=group["eps"], amsgrad=False, maximize=False, grad_scale=None, found_inf=None)
    for (ha, hs), a, s in zip(host, avgs, sqs):
        if a is not ha:
            ha.copy_(a, non_blocking=True)
            hs.copy_(s, non_blocking=True)
    if dev.type == "cuda":
        torch.cuda.current_stream(dev).synchronize()  # the host copies are complete before the next step reads them


class ShardedAdamW:
    """torch's AdamW over (FSDP2) parameters. On CUDA a `fused=True` AdamW whose step runs on the local
    shards (`fused_adamw_step_local`), or foreach when the fused kernel cannot take these tensors; on
    CPU plain AdamW. `optimizer` is the torch optimizer (checkpoints save and load it).

    `fused`: use the fused kernel on CPU parameters too (FSDP2 CPUOffloadPolicy: the step runs on the
    CPU). `offload_state`: keep the moments in CPU memory and stream them (`streamed_adamw_step`)."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float, weight_decay: float, betas=(0.9, 0.95),
                 fused: bool | None = None, offload_state: bool = False):
        self.params = list(params)
        self.cuda = self.params[0].device.type == "cuda"
        self.fused = self.cuda if fused is None else fused
        self.offload_state = offload_state
        self._args = dict(lr=lr, weight_decay=weight_decay, betas=betas)
        self.optimizer = self._make(fused=self.fused)
        self._fused_checked, self._fused_local = not self.fused, False

    def _make(self, fused: bool) -> torch.optim.Optimizer:
        kind = {"fused": True} if fused else {"foreach": self.cuda}
        return torch.optim.AdamW(self.params, **self._args, **kind)

    def prepare_load(self) -> None:
        """Before a checkpoint load: with offloaded state, create it in CPU memory (the loader would
        otherwise initialise it on the device with a zero step)."""
        if self.offload_state:
            host_adamw_state(self.optimizer)

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self) -> None:
        if self.offload_state:
            streamed_adamw_step(self.optimizer)
            return
        if self._fused_checked:
            fused_adamw_step_local(self.optimizer) if self._fused_local else self.optimizer.step()
            return
        try:
            fused_adamw_step_local(self.optimizer)
            self._fused_local = True
        except (RuntimeError, NotImplementedError, TypeError) as exc:  # fused kernel unavailable for these tensors
            log.warning("fused AdamW unavailable (%s); using foreach", exc)
            lrs = [g["lr"] for g in self.optimizer.param_groups]
            self.optimizer = self._make(fused=False)
            for g, lr in zip(self.optimizer.param_groups, lrs):
                g["lr"] = lr
            self.optimizer.step()
        self._fused_checked = True

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

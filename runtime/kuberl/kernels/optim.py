"""Optimiser kernels on FSDP2's local shards: gradient clipping and the fused AdamW step without DTensor
dispatch over hundreds of tensors, and an AdamW that uses them where it can."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from .. import dist as kdist

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
        kdist.dist.all_reduce(sq)
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


class ShardedAdamW:
    """torch's AdamW over (FSDP2) parameters. On CUDA a `fused=True` AdamW whose step runs on the local
    shards (`fused_adamw_step_local`), or foreach when the fused kernel cannot take these tensors; on
    CPU plain AdamW. `optimizer` is the torch optimizer (checkpoints save and load it)."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float, weight_decay: float, betas=(0.9, 0.95)):
        self.params = list(params)
        self.cuda = self.params[0].device.type == "cuda"
        self._args = dict(lr=lr, weight_decay=weight_decay, betas=betas)
        self.optimizer = self._make(fused=self.cuda)
        self._fused_checked, self._fused_local = not self.cuda, False

    def _make(self, fused: bool) -> torch.optim.Optimizer:
        kind = {"fused": True} if fused else {"foreach": self.cuda}
        return torch.optim.AdamW(self.params, **self._args, **kind)

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self) -> None:
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

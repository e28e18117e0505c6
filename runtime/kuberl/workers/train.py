"""FSDP2 training of one model on one role's ranks: shard, micro-batch, normalise, clip, step, checkpoint."""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from .. import dist as kdist
from ..batch import Batch
from ..spec.model import TrainerSpec

# loss_fn(micro_batch) -> (sum of per-token loss over the micro-batch's valid tokens, {stat: token-sum})
LossFn = Callable[[Batch], tuple[torch.Tensor, dict[str, torch.Tensor]]]


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


class FSDPTrainer:
    """Owns a sharded model and its AdamW optimizer."""

    def __init__(self, model: nn.Module, device: torch.device, dtype: torch.dtype, lr: float,
                 weight_decay: float, grad_clip: float, warmup_steps: int = 0):
        self.model = kdist.shard(model, device, dtype)
        self._opt_args = dict(lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95))
        # CUDA: a fused AdamW, whose step runs on the local shards (fused_adamw_step_local); foreach
        # AdamW if that is unavailable. CPU: plain AdamW, as before.
        self.optimizer = self._make_optimizer(fused=device.type == "cuda")
        self._fused_checked = device.type != "cuda"
        self._fused_local = False
        self.base_lr, self.warmup_steps, self.grad_clip = lr, warmup_steps, grad_clip

    def _make_optimizer(self, fused: bool) -> torch.optim.Optimizer:
        kind = {"fused": True} if fused else {"foreach": next(self.model.parameters()).device.type == "cuda"}
        return torch.optim.AdamW(self.model.parameters(), **self._opt_args, **kind)

    def _step(self) -> None:
        if self._fused_checked:
            fused_adamw_step_local(self.optimizer) if self._fused_local else self.optimizer.step()
            return
        try:
            fused_adamw_step_local(self.optimizer)
            self._fused_local = True
        except (RuntimeError, NotImplementedError, TypeError) as exc:  # fused kernel unavailable for these tensors
            import logging

            logging.getLogger(__name__).warning("fused AdamW unavailable (%s); using foreach", exc)
            lrs = [g["lr"] for g in self.optimizer.param_groups]
            self.optimizer = self._make_optimizer(fused=False)
            for g, lr in zip(self.optimizer.param_groups, lrs):
                g["lr"] = lr
            self.optimizer.step()
        self._fused_checked = True

    def train_minibatch(self, mb: Batch, micro_size: int, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step over a mini-batch on this rank.

        The loss is the mean over every valid token of the mini-batch *across all ranks*: each micro
        loss is a token-sum scaled by world_size / global_tokens, and FSDP averages gradients over
        ranks, so 2 ranks give the same update as 1 rank on the whole mini-batch.
        """
        mask = mb["response_mask"]
        global_tokens = kdist.all_reduce_sum(mask.sum().float().reshape(1)).clamp(min=1.0)
        scale = kdist.dist.get_world_size() / global_tokens
        sums: dict[str, torch.Tensor] = {}
        for micro in mb.minibatches(micro_size):
            loss, stats = loss_fn(micro)
            (loss * scale).backward()
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v.detach().float()
        grad_norm = clip_grad_norm_local(self.model.parameters(), self.grad_clip)
        self._step()
        self.optimizer.zero_grad(set_to_none=True)
        keys = sorted(sums)
        totals = kdist.all_reduce_sum(torch.stack([sums[k].reshape(()) for k in keys]).cpu()) if keys else torch.zeros(0)
        out = {k: float(totals[i] / global_tokens.cpu()) for i, k in enumerate(keys)}
        out["grad_norm"] = float(grad_norm)
        return out

    def fit(self, batch: Batch, step: int, tr: TrainerSpec, loss_fn: LossFn) -> dict[str, float]:
        """`tr.ppo_epochs` passes over this rank's shard of the batch in shuffled mini-batches of
        `tr.mini_batch_size` samples (global, across ranks); returns stats averaged over optimizer steps."""
        self.set_step(step)
        self.model.train()
        mini = tr.mini_batch_size // kdist.dist.get_world_size()
        gen = torch.Generator().manual_seed(tr.seed * 7919 + step)
        sums: dict[str, float] = {}
        count = 0
        for _ in range(tr.ppo_epochs):
            for mb in batch.minibatches(mini, gen):
                for k, v in self.train_minibatch(mb, tr.micro_batch_size, loss_fn).items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        self.model.eval()
        return {k: v / count for k, v in sums.items()}

    def set_step(self, step: int) -> float:
        """Linear warm-up over `warmup_steps`, then constant; a function of the step, so it needs no state."""
        lr = self.base_lr * min(1.0, (step + 1) / (self.warmup_steps + 1))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded weights (every rank gets them; used for rollout weight sync)."""
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))

    def save(self, path: str) -> None:
        """World-size-independent checkpoint (torch DCP) of model + optimizer."""
        msd, osd = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)

    def load(self, path: str) -> None:
        msd, osd = get_state_dict(self.model, self.optimizer)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

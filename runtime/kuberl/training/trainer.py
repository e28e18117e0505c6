"""FSDP2 training of one model on one role's ranks: shard, mini- and micro-batches, token-normalised
losses, clip, step. The optimiser kernels are in `kuberl.training.kernels.optim`, checkpoint I/O in
`kuberl.resilience.checkpoint` and `kuberl.resilience.saves` (asynchronous writes, per-step snapshots)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from kuberl import algos
from kuberl.data.batch import Batch
from kuberl.resilience import checkpoint
from kuberl.resilience.saves import AsyncSaver
from kuberl.spec.model import ADAMW_BETAS, LoraSpec, OffloadSpec, TrainerSpec
from kuberl.training import dist as kdist
from kuberl.training import lora
from kuberl.training.kernels.optim import ShardedAdamW, clip_grad_norm_local
from kuberl.training.kernels.options import KernelOptions
from kuberl.training.micro import micro_rows

if TYPE_CHECKING:
    from kuberl.workers.base import Worker

# loss_fn(micro_batch) -> (sum of its per-token loss terms times its "loss_weight" [B, T], the micro-batch's share of
# the mini-batch's loss; {stat: token-sum})
LossFn = Callable[[Batch], tuple[torch.Tensor, dict[str, torch.Tensor]]]


class FSDPTrainer:
    """Owns a sharded model and its AdamW optimizer."""

    def __init__(self, model: nn.Module, device: torch.device, dtype: torch.dtype, *, lr: float,
                 weight_decay: float, grad_clip: float, warmup_steps: int = 0, betas: tuple[float, float] = ADAMW_BETAS,
                 kernels: KernelOptions | None = None, offload: OffloadSpec | None = None,
                 lora_spec: LoraSpec | None = None, head: tuple[str, ...] = (), seed: int = 0):
        """`lr`, `betas`, `weight_decay`: AdamW's; `warmup_steps`: of linear warm-up (set_step); `grad_clip`: the
        gradients' global norm bound. `kernels`: which training kernels to use (default: none of the compiled or
        fused ones).
        `offload`: the role's CPU offload (params: FSDP2 CPUOffloadPolicy, the AdamW step on the CPU with
        the fused kernel; optimizer alone: the moments streamed through the GPU each step). `lora_spec`
        (rank > 0): adapters on its target layers, everything else frozen but the parameters named by
        the `head` prefixes, the adapters drawn from `seed`; checkpoints then hold those and their optimizer
        state only."""
        kernels, offload = kernels or KernelOptions(), offload or OffloadSpec()
        self.lora = lora_spec if lora_spec is not None and lora_spec.enabled else None
        if self.lora:
            lora.apply_lora(model, self.lora, trainable=head, seed=seed)
        self.model = kdist.shard(model, device, dtype, compile_blocks=kernels.compile_blocks,
                                 offload_params=offload.params, reshard_after_forward=offload.reshard_after_forward)
        on_gpu = device.type == "cuda"
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = ShardedAdamW(trainable, lr=lr, weight_decay=weight_decay, betas=betas, fused=on_gpu,
                                      offload_state=offload.optimizer and not offload.params)
        self.base_lr, self.warmup_steps, self.grad_clip = lr, warmup_steps, grad_clip
        self.trained_step = 0  # updates applied: the step whose state the model holds (0: the model path's)
        self.last_result: dict[str, float] | None = None  # what the update to trained_step returned, when known
        self.saver = AsyncSaver()
        self._loading = threading.Lock()

    @classmethod
    def for_role(cls, worker: Worker, model: nn.Module, head: tuple[str, ...] = ()) -> FSDPTrainer:
        """The trainer of a training role's worker: its device, dtype and kernels, its optimizer in effect
        (JobSpec.optim: spec.roles.<role>.optim with its deprecated aliases), offload and LoRA, and spec.trainer's
        gradClip and seed."""
        tr, rs, optim = worker.spec.trainer, worker.spec.roles.get(worker.role), worker.spec.optim(worker.role)
        return cls(model, worker.device, worker.dtype, lr=optim.lr, weight_decay=optim.weight_decay,
                   grad_clip=tr.grad_clip, warmup_steps=optim.warmup_steps, betas=tuple(optim.betas),
                   kernels=worker.kernels, offload=rs.offload, lora_spec=rs.lora, head=head, seed=tr.seed)

    def train_minibatch(self, mb: Batch, micro_size: int, loss_fn: LossFn, aggregation: str = "token-mean",
                        max_tokens: int | None = None) -> dict[str, float]:
        """One optimizer step over a mini-batch on this rank.

        The loss aggregates every valid token of the mini-batch *across all ranks* (`aggregation`: how, see
        `kuberl.algos.aggregation_weights`): each row gets its tokens' weights as "loss_weight" [B, T], a
        micro loss is its weighted sum, scaled by world_size since FSDP averages gradients over ranks, so 2
        ranks give the same update as 1 rank on the whole mini-batch. Stats are token means. Micro-batches take
        `micro_size` rows, or with `max_tokens` rows of at most that many tokens (`kuberl.training.micro`).
        """
        mask = mb["response_mask"]
        tokens, sequences = kdist.all_reduce_sum(torch.stack([mask.sum().float(), (mask.sum(-1) > 0).sum().float()]))
        global_tokens = tokens.clamp(min=1.0)
        mb.tensors["loss_weight"] = algos.aggregation_weights(mask, aggregation, tokens, sequences)
        world = kdist.dist.get_world_size()
        sums: dict[str, torch.Tensor] = {}
        for rows in micro_rows(mb, micro_size, max_tokens):
            loss, stats = loss_fn(mb.index(rows))
            (loss * world).backward()
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v.detach().float()
        grad_norm = clip_grad_norm_local(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad()
        keys = sorted(sums)
        totals = torch.zeros(0)
        if keys:
            totals = kdist.all_reduce_sum(torch.stack([sums[k].reshape(()) for k in keys]).cpu())
        out = {k: float(totals[i] / global_tokens.cpu()) for i, k in enumerate(keys)}
        out["grad_norm"] = float(grad_norm)
        return out

    def fit(self, batch: Batch, step: int, tr: TrainerSpec, loss_fn: LossFn,
            aggregation: str = "token-mean") -> dict[str, float]:
        """`tr.ppo_epochs` passes over this rank's shard of the batch in shuffled mini-batches of
        `tr.mini_batch_size` samples (global, across ranks), the loss aggregated by `aggregation`
        (`train_minibatch`); returns stats averaged over optimizer steps.
        The update to a step the state holds already (restored from that update's own snapshot: the call was
        sent again because the driver never saw its answer) is not applied twice: it returns what it returned."""
        if step + 1 == self.trained_step and self.last_result is not None:
            return dict(self.last_result)
        if step + 1 <= self.trained_step:
            raise RuntimeError(f"the update to trained step {step + 1} is already held (trained step "
                               f"{self.trained_step}) and its result is unknown: not applied twice")
        self.saver.before_update()  # the snapshot of the last update, copying in the background, is whole first
        self.set_step(step)
        self.model.train()
        mini = tr.mini_batch_size // kdist.dist.get_world_size()
        gen = torch.Generator().manual_seed(tr.seed * 7919 + step)
        sums: dict[str, float] = {}
        count = 0
        for _ in range(tr.ppo_epochs):
            for mb in batch.minibatches(mini, gen):
                for k, v in self.train_minibatch(mb, tr.micro_batch_size, loss_fn, aggregation,
                                                 tr.max_tokens_per_micro_batch).items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        self.model.eval()
        self.trained_step, self.last_result = step + 1, {k: v / count for k, v in sums.items()}
        self.saver.snapshot(self.model, self.optimizer.optimizer, self.trained_step, self.last_result)
        return dict(self.last_result)

    def set_step(self, step: int) -> float:
        """Linear warm-up over `warmup_steps`, then constant; a function of the step, so it needs no state."""
        lr = self.base_lr * min(1.0, (step + 1) / (self.warmup_steps + 1))
        self.optimizer.set_lr(lr)
        return lr

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded weights under the base model's names (every rank gets them; used for rollout weight
        sync); with LoRA the adapters merged into them."""
        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        return lora.merge(state, self.lora.alpha / self.lora.rank) if self.lora else state

    def save(self, path: str) -> int:
        """Start a world-size-independent checkpoint (torch DCP) of model + optimizer (with LoRA: adapters
        only), written in the background (`saver.wait()` completes it); returns the trained step saved."""
        self.saver.save(self.model, self.optimizer.optimizer, path, trainable_only=self.lora is not None,
                        step=self.trained_step)
        return self.trained_step

    def enable_snapshots(self, root: str) -> None:
        """Snapshot the trainable state after every update under `root` (kuberl.resilience.saves); the slots are set up
        in the background from now on."""
        self.saver.snapshot_root = root
        self.saver.reserve(self.model, self.optimizer.optimizer)

    def load_snapshot(self, step: int, newer_only: bool = False) -> bool:
        """Load this rank's per-step snapshot of trained step `step` (kuberl.resilience.saves) in place, unless the
        state held is that step's already (a standby that followed it) or, with `newer_only`, a later
        one's. Returns whether it loaded. One load at a time (a standby's follow may run beside it)."""
        with self._loading:
            if step == self.trained_step or (newer_only and step < self.trained_step):
                return False
            self.trained_step = -1  # unknown until the copy is whole (a standby's read can meet a rewrite)
            self.last_result = self.saver.load_snapshot(self.model, self.optimizer.optimizer, step,
                                                        self._init_optimizer_state)
            self.trained_step = step
            return True

    def _init_optimizer_state(self) -> None:
        """Create the optimizer's state (a step on zero gradients); what it changes is overwritten next."""
        for p in self.model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        self.optimizer.step()
        self.optimizer.zero_grad()

    def load(self, path: str, step: int) -> None:
        """Load the state of trained step `step` from `path` (a checkpoint)."""
        self.saver.wait()
        with self._loading:
            self.optimizer.prepare_load()
            checkpoint.load_trainable(self.model, self.optimizer.optimizer, path, trainable_only=self.lora is not None)
            self.trained_step, self.last_result = step, None

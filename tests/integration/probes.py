"""Test-only probes on role workers: a mixin, so production workers carry none of them.

Ray workers import this module by name (they run in the repository root, like pytest)."""

from __future__ import annotations

import hashlib

import torch

from kuberl.resilience.saves import shard_tensors
from kuberl.workers import ActorWorker, CriticWorker, RewardWorker, Worker
from kuberl.workers.dispatch import Dispatch, register


class Probes:
    """Read a trained role's weights (actor, critic) and the actor's rollout engine."""

    @register(Dispatch.ALL)
    def full_state_dict(self: Worker) -> dict[str, torch.Tensor]:
        """Unsharded trainable weights on CPU, from every rank (tests compare world sizes with it)."""
        return {k: v.detach().cpu() for k, v in self.trainer.full_state_dict().items()}

    @register(Dispatch.ONE)
    def weights_digest(self: Worker) -> float:
        """A cheap fingerprint of the trainable weights (sum of |w| in float64), equal across world sizes."""
        return float(sum(v.double().abs().sum() for v in self.trainer.full_state_dict().values()))

    @register(Dispatch.ALL)
    def state_digest(self: Worker) -> str:
        """sha256 of this rank's trainable state, byte for byte: each parameter shard and its optimizer
        state (`kuberl.resilience.saves.shard_tensors`), so two digests are equal only when the states are
        bit-identical."""
        h = hashlib.sha256()
        for t in shard_tensors(self.trainer.model, self.trainer.optimizer.optimizer):
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    @register(Dispatch.ONE)
    def rollout_weights_match(self: ActorWorker) -> bool:
        """True when the rollout engine holds exactly the policy's current weights."""
        if not hasattr(self.engine, "model"):
            raise NotImplementedError(f"{type(self.engine).__name__} does not expose its weights for comparison")
        full = self.trainer.full_state_dict()
        params = dict(self.engine.model.named_parameters())
        return all(torch.equal(params[k].float().cpu(), v.float().cpu()) for k, v in full.items() if k in params)


class ProbedActor(Probes, ActorWorker):
    pass


class ProbedCritic(Probes, CriticWorker):
    pass


PROBED: dict[str, type[Worker]] = {"actor": ProbedActor, "critic": ProbedCritic}


class CollectiveErrorReward(RewardWorker):
    """A reward role whose scoring fails with the same torch.distributed error on every call: a
    deterministic error that looks like a broken collective (so the first one gets a restart)."""

    @register(Dispatch.SPLIT)
    def compute_scores(self, batch):
        raise torch.distributed.DistBackendError("simulated: allreduce failed the same way every time")

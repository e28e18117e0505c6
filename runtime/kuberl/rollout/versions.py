"""Policy versions of a fully asynchronous rollout (spec.rollout.async), the pure part.

A version is the number of updates the weights hold: 0 as loaded, k after step k's update. Rollout workers tag
every response token with the version of the weights that drew it (`token_versions`); a sample is as stale as
its oldest token (`sample_staleness`), and the driver takes a batch only when that is at most maxStaleness
(`StalenessGate`). `StagedWeights` hands the actor's pushed weights to a worker's generating thread, which applies
them between two generations (partial: finish) or between two decode steps (partial: continue).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
from torch import Tensor


def token_versions(step_versions: list[int], rows: int, width: int) -> Tensor:
    """[rows, width] int64: decode step i's version for every row's token i; positions past the steps taken (a
    generation that ended early) carry the last one."""
    if not step_versions:
        return torch.zeros(rows, width, dtype=torch.long)
    steps = torch.tensor(step_versions[:width], dtype=torch.long)
    steps = torch.cat([steps, steps[-1:].expand(width - len(steps))])
    return steps.expand(rows, width).clone()


def sample_staleness(versions: Tensor, mask: Tensor, trained: int) -> Tensor:
    """[B] int64: how many versions each sample's oldest response token (under `mask` [B, R]; a sample with none:
    its first) lags `trained`, the version the trainer holds."""
    big = torch.iinfo(torch.long).max
    oldest = torch.where(mask.bool(), versions, big).min(dim=-1).values
    oldest = torch.where(oldest == big, versions[:, 0], oldest)
    return trained - oldest


@dataclass
class StalenessGate:
    """Which rollouts the trainer takes (oldest token at most `max_staleness` behind), with the step's counts."""

    max_staleness: int
    dropped: int = 0  # samples too stale, since the last `step_stats`
    lost: int = 0  # samples lost with a dead rollout worker, since the last `step_stats`
    taken: list[Tensor] = field(default_factory=list)  # staleness [B] of each batch taken since then

    def admit(self, versions: Tensor, mask: Tensor, trained: int) -> bool:
        """Whether the batch (token versions and response mask [B, R]) is fresh enough; a stale one is counted."""
        staleness = sample_staleness(versions, mask, trained)
        if int(staleness.max()) > self.max_staleness:
            self.dropped += len(staleness)
            return False
        self.taken.append(staleness)
        return True

    def count_lost(self, samples: int) -> None:
        self.lost += samples

    def step_stats(self) -> dict[str, float]:
        """The step's metrics (staleness of its samples, mean and max; samples dropped and lost), then reset."""
        s = torch.cat(self.taken).float() if self.taken else torch.zeros(1)
        out = {"staleness_mean": float(s.mean()), "staleness_max": float(s.max()),
               "samples_dropped_stale": float(self.dropped), "samples_lost_rollout": float(self.lost)}
        self.dropped, self.lost, self.taken = 0, 0, []
        return out


class StagedWeights:
    """The newest weights pushed to a rollout worker and not yet applied: pushed from the calling thread, taken up
    by the generating one. `version` is that of the weights the engine holds."""

    def __init__(self, version: int = 0):
        self.version = version
        self._lock = threading.Lock()
        self._pending: tuple[dict[str, Tensor], int] | None = None
        self.received = threading.Event()  # set by the first push: a worker generates nothing before it

    def push(self, state: dict[str, Tensor], version: int) -> None:
        """Stage `state` (version `version`); an older staged one is replaced, never applied."""
        with self._lock:
            if self._pending is None or version > self._pending[1]:
                self._pending = (state, version)
        self.received.set()

    def take(self) -> tuple[dict[str, Tensor], int] | None:
        """The staged weights and their version, if any (they are no longer staged)."""
        with self._lock:
            pending, self._pending = self._pending, None
        return pending

"""`Batch`: per-sample tensors plus per-sample metadata, split across data-parallel ranks and gathered back."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Batch:
    """`tensors[k]` has the batch dimension first ([B, ...]); `meta[k]` is a list of length B."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, list[Any]] = field(default_factory=dict)

    def __len__(self) -> int:
        for t in self.tensors.values():
            return t.shape[0]
        for m in self.meta.values():
            return len(m)
        return 0

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def index(self, idx: slice | torch.Tensor) -> Batch:
        """Rows `idx` (a slice or a LongTensor of row indices)."""
        if isinstance(idx, slice):
            rows = range(len(self))[idx]
            return Batch({k: v[idx] for k, v in self.tensors.items()},
                         {k: [v[i] for i in rows] for k, v in self.meta.items()})
        ids = idx.tolist()
        return Batch({k: v[idx] for k, v in self.tensors.items()},
                     {k: [v[i] for i in ids] for k, v in self.meta.items()})

    def split(self, n: int) -> list[Batch]:
        """n contiguous, equal chunks (len must be divisible by n)."""
        size = len(self)
        if size % n:
            raise ValueError(f"batch of {size} cannot be split evenly across {n} ranks")
        step = size // n
        return [self.index(slice(i * step, (i + 1) * step)) for i in range(n)]

    def minibatches(self, size: int, generator: torch.Generator | None = None) -> Iterator[Batch]:
        """Shuffled (when a generator is given) chunks of `size` rows."""
        order = torch.randperm(len(self), generator=generator) if generator is not None else torch.arange(len(self))
        for start in range(0, len(self), size):
            yield self.index(order[start : start + size])

    def select(self, *keys: str) -> Batch:
        """Only the named tensors/meta keys (what a worker needs; keeps Ray transfers small)."""
        return Batch({k: v for k, v in self.tensors.items() if k in keys},
                     {k: v for k, v in self.meta.items() if k in keys})

    def update(self, other: Batch) -> Batch:
        self.tensors.update(other.tensors)
        self.meta.update(other.meta)
        return self

    def to(self, device: torch.device | str) -> Batch:
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, dict(self.meta))

    @staticmethod
    def concat(parts: list[Batch]) -> Batch:
        if not parts:
            return Batch()
        tensors = {k: torch.cat([p.tensors[k] for p in parts]) for k in parts[0].tensors}
        meta = {k: [x for p in parts for x in p.meta[k]] for k in parts[0].meta}
        return Batch(tensors, meta)

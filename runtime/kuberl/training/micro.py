"""Micro-batches: the rows of a batch that one forward (and backward) takes at a time on a rank, cut by a count of
samples (`spec.trainer.microBatchSize`) or by a budget of tokens (`spec.trainer.maxTokensPerMicroBatch`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kuberl.data.batch import Batch
from kuberl.training import dist as kdist


def token_budget_groups(lengths: list[int], budget: int) -> list[list[int]]:
    """Row indices grouped so that each group's tokens stay within `budget`, by first-fit decreasing (few groups of
    even size); a row longer than the budget goes alone. Each group in row order, groups by their first row."""
    groups: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        fit = next((g for g, load in enumerate(loads) if load + lengths[i] <= budget), None)
        if fit is None:
            groups.append([i])
            loads.append(lengths[i])
        else:
            groups[fit].append(i)
            loads[fit] += lengths[i]
    return sorted((sorted(g) for g in groups), key=lambda g: g[0])


def split_to(groups: list[list[int]], count: int) -> list[list[int]]:
    """`groups` split until there are `count` of them: the group of most rows in halves, each time. FSDP ranks run
    their forwards together, so every rank needs as many micro-batches as the rank that needs most."""
    groups = [list(g) for g in groups]
    while len(groups) < count:
        big = max(range(len(groups)), key=lambda g: len(groups[g]))
        if len(groups[big]) < 2:
            raise ValueError(f"{sum(map(len, groups))} rows cannot make {count} micro-batches")
        half = len(groups[big]) // 2
        groups[big:big + 1] = [groups[big][:half], groups[big][half:]]
    return groups


def micro_rows(batch: Batch, size: int, max_tokens: int | None = None) -> list[torch.Tensor]:
    """This rank's micro-batches of `batch` as row indices: `size` rows each, or with `max_tokens` rows whose real
    tokens (the attention mask's) sum to at most it, as many on every rank (a collective under torch.distributed)."""
    if max_tokens is None:
        return list(torch.arange(len(batch)).split(size))
    mask = batch["attention_mask"]
    groups = token_budget_groups(mask.sum(1).tolist(), max_tokens)
    count = int(kdist.all_reduce_max(torch.tensor([len(groups)], device=mask.device)).item())
    return [torch.tensor(g) for g in split_to(groups, count)]


def map_rows(batch: Batch, rows: list[torch.Tensor], fn: Callable[[Batch], torch.Tensor]) -> torch.Tensor:
    """fn over each micro-batch (its rows of `batch`) -> [B, ...], the results back in `batch`'s row order."""
    out = torch.cat([fn(batch.index(r)) for r in rows])
    order = torch.cat(rows).to(out.device)
    return out[torch.argsort(order)]

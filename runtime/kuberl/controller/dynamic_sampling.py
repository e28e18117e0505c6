"""DAPO's dynamic sampling (spec.algorithm.dynamicSampling), the pure part: which groups of a scored rollout
carry a signal, and the step's batch assembled from several rollouts. The driver sends the rollouts."""

from __future__ import annotations

import torch
from torch import Tensor

from kuberl.data.batch import Batch

# tensors whose second dimension holds the (left-padded) prompt: their fill where a narrower rollout is widened
PROMPT_WIDE = {"prompt_ids": "pad", "input_ids": "pad", "prompt_mask": 0, "attention_mask": 0}


def informative(scores: Tensor, group_index: Tensor) -> Tensor:
    """Rows [B] (bool) whose group's scores [B] are not all equal: the groups an advantage can be taken from."""
    _, group = torch.unique(group_index, return_inverse=True)
    n = int(group.max()) + 1 if len(group) else 0
    scores = scores.float()
    hi = torch.full((n,), -torch.inf).scatter_reduce(0, group, scores, "amax")
    lo = torch.full((n,), torch.inf).scatter_reduce(0, group, scores, "amin")
    return (hi > lo)[group]


def count_informative(parts: list[Batch], group_size: int) -> int:
    """Groups with a signal in scored rollouts `parts`."""
    return sum(int(informative(p["scores"], p["group_index"]).sum()) // group_size for p in parts)


def assemble(parts: list[Batch], groups: int, group_size: int, pad_id: int) -> tuple[Batch, int]:
    """A batch of `groups` whole groups of `group_size` rows from scored rollouts `parts` (a group's rows
    contiguous): the informative groups first, in the order drawn, then, while short, the others. Prompts are
    left-padded to the widest part's; group_index is renumbered 0..groups-1. Returns it and how many of its
    groups are informative."""
    width = max(p["prompt_ids"].shape[1] for p in parts)
    widened = [_widen(p, width, pad_id) for p in parts]
    keep = [informative(p["scores"], p["group_index"]) for p in parts]
    chosen = [p.index(torch.nonzero(k).flatten()) for p, k in zip(widened, keep)]
    spare = [p.index(torch.nonzero(~k).flatten()) for p, k in zip(widened, keep)]
    rows = groups * group_size
    out = Batch.concat([*chosen, *spare]).index(slice(0, rows))
    if len(out) < rows:
        raise ValueError(f"dynamic sampling: {len(out)} rows drawn for a batch of {rows}")
    out.tensors["group_index"] = torch.arange(rows) // group_size
    return out, min(groups, sum(int(k.sum()) for k in keep) // group_size)


def _widen(part: Batch, width: int, pad_id: int) -> Batch:
    """`part` with its prompt-wide tensors left-padded to `width` prompt tokens."""
    extra = width - part["prompt_ids"].shape[1]
    if extra == 0:
        return part
    tensors = dict(part.tensors)
    for key, fill in PROMPT_WIDE.items():
        if key in tensors:
            t = tensors[key]
            tensors[key] = torch.cat([t.new_full((len(t), extra), pad_id if fill == "pad" else fill), t], dim=1)
    return Batch(tensors, dict(part.meta))

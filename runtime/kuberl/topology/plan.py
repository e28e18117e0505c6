"""Partition a machine's GPUs into equal groups with the best links inside each group.

Objective, compared lexicographically (each step only breaks ties of the one before):

1. fewest groups that span more than one NUMA node (GPUs with unknown or multi-node NUMA affinity
   never count as a split) -- so a same-NUMA grouping wins even when every link is SYS;
2. the best worst intra-group link (by :func:`link_score`);
3. the largest sum of intra-group pair scores (more NVLinks, closer PCIe paths).

Remaining ties go to the partition that is lexicographically smallest when written with sorted groups
in order of their lowest GPU ("lowest indices first"). Up to :data:`EXACT_MAX_GPUS` GPUs the search
is exact (all set partitions, with pruning); above that a greedy fill plus pairwise-swap local search
is used, which is deterministic but not guaranteed optimal.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import combinations

from kuberl.topology.matrix import SELF, LinkMatrix, TopologyError, link_score

EXACT_MAX_GPUS = 8

Key = tuple[int, float, float]  # (-numa splits, worst pair score, sum of pair scores); larger is better


@dataclass
class Plan:
    """GPU groups (GPU indices), their worst intra-group link and the sum of pair scores."""

    groups: list[list[int]]
    worst_link: str
    score: float

    def to_json(self) -> dict:
        """``{"groups": [[0, 1], [2, 3]], "worst_link": "PIX", "score": 10.0}``."""
        return {"groups": [list(g) for g in self.groups], "worst_link": self.worst_link, "score": self.score}


def plan_groups(m: LinkMatrix, group_size: int, gpus: list[int] | None = None) -> Plan:
    """Split ``gpus`` (default: all GPUs of ``m``) into groups of ``group_size`` maximising link quality."""
    chosen = list(m.indices) if gpus is None else list(gpus)
    _validate(m, group_size, chosen)
    scorer = _Scorer(m)
    items = sorted(chosen)
    if len(items) <= EXACT_MAX_GPUS:
        groups = _exact(items, group_size, scorer)
    else:
        groups = _local_search(_greedy(items, group_size, scorer), scorer)
    groups = sorted(sorted(g) for g in groups)
    pairs = [(a, b) for g in groups for a, b in combinations(g, 2)]
    worst = min(pairs, key=lambda p: scorer.score[p], default=None)
    return Plan(
        groups=groups,
        worst_link=SELF if worst is None else m.link(*worst),
        score=float(sum(scorer.score[p] for p in pairs)),
    )


def pin_devices(plan: Plan, local_rank: int) -> tuple[list[int], int]:
    """The devices of ``local_rank``'s group and the rank's own device.

    Ranks fill groups in order: with groups of k, ranks ``[g*k, (g+1)*k)`` form group ``g`` and rank
    ``r`` owns ``plan.groups[r // k][r % k]``. Indices are nvidia-smi/NVML (PCI bus) order; use them
    with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA numbers the GPUs the same way.
    """
    k = len(plan.groups[0])
    total = k * len(plan.groups)
    if not 0 <= local_rank < total:
        raise TopologyError(f"local rank {local_rank} is out of range: the plan has {total} GPUs")
    group = plan.groups[local_rank // k]
    return list(group), group[local_rank % k]


def _validate(m: LinkMatrix, k: int, gpus: list[int]) -> None:
    if k < 1:
        raise TopologyError(f"group size must be at least 1, got {k}")
    if not gpus:
        raise TopologyError("no GPUs to plan")
    seen: set[int] = set()
    for g in gpus:
        m.position(g)
        if g in seen:
            raise TopologyError(f"GPU {g} is listed twice")
        seen.add(g)
    if len(gpus) % k:
        raise TopologyError(f"cannot split {len(gpus)} GPUs into groups of {k}: {k} does not divide {len(gpus)}")


class _Scorer:
    """Pair scores and NUMA nodes of one matrix, keyed by GPU index."""

    def __init__(self, m: LinkMatrix) -> None:
        self.numa = {g: m.numa_node(g) for g in m.indices}
        self.score = {(a, b): link_score(m.link(a, b)) for a in m.indices for b in m.indices if a != b}

    def group(self, group: tuple[int, ...]) -> Key:
        nodes = {self.numa[g] for g in group} - {None}
        scores = [self.score[p] for p in combinations(group, 2)]
        return (-1 if len(nodes) > 1 else 0, min(scores, default=math.inf), sum(scores))

    def partition(self, groups: list[tuple[int, ...]]) -> Key:
        keys = [self.group(g) for g in groups]
        return (sum(k[0] for k in keys), min(k[1] for k in keys), sum(k[2] for k in keys))


def _exact(items: list[int], k: int, scorer: _Scorer) -> list[tuple[int, ...]]:
    """Best partition by enumerating set partitions in lexicographic order (first best wins ties)."""
    best: list[tuple[int, ...]] = []
    best_key: Key | None = None

    def walk(rest: tuple[int, ...], groups: list[tuple[int, ...]], key: Key) -> None:
        nonlocal best, best_key
        if best_key is not None and key[:2] < best_key[:2]:
            return  # splits only grow and the worst link only drops as groups are added
        if not rest:
            if best_key is None or key > best_key:
                best, best_key = list(groups), key
            return
        first, others = rest[0], rest[1:]
        for mates in combinations(others, k - 1):
            group = (first, *mates)
            g = scorer.group(group)
            left = tuple(x for x in others if x not in mates)
            walk(left, [*groups, group], (key[0] + g[0], min(key[1], g[1]), key[2] + g[2]))

    walk(tuple(items), [], (0, math.inf, 0.0))
    return best


def _greedy(items: list[int], k: int, scorer: _Scorer) -> list[tuple[int, ...]]:
    """Seed each group with the lowest free GPU, then add the GPU that keeps the group's key best."""
    free = list(items)
    groups = []
    while free:
        group = (free.pop(0),)
        while len(group) < k:
            pick = max(free, key=lambda g: (scorer.group((*group, g)), -g))
            free.remove(pick)
            group = (*group, pick)
        groups.append(group)
    return groups


def _local_search(groups: list[tuple[int, ...]], scorer: _Scorer) -> list[tuple[int, ...]]:
    """Swap GPUs between groups while the partition key strictly improves (first improvement)."""
    key = scorer.partition(groups)
    while True:
        better = next((t for t in _swaps(groups) if scorer.partition(t) > key), None)
        if better is None:
            return groups
        groups, key = better, scorer.partition(better)


def _swaps(groups: list[tuple[int, ...]]) -> Iterator[list[tuple[int, ...]]]:
    """Every partition one swap of two GPUs (from different groups) away, lowest indices first."""
    for i, j in combinations(range(len(groups)), 2):
        for x in groups[i]:
            for y in groups[j]:
                trial = list(groups)
                trial[i] = tuple(sorted(y if g == x else g for g in groups[i]))
                trial[j] = tuple(sorted(x if g == y else g for g in groups[j]))
                yield trial

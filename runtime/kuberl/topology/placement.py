"""Pin a role's ranks to GPUs by link topology, inside one node (placement layer 3, docs/placement.md).

The ranks of a role that share a node own a set of GPUs (the union of what Ray reserved for them).
The planner partitions those GPUs into groups of `group_size` (a tensor-parallel group, or a replica's
FSDP shard group) maximising link quality, and local rank r gets the r-th GPU in plan order. The worst
link inside the role's groups sets NCCL_P2P_LEVEL and is compared with `spec.placement.minLink`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kuberl import logs
from kuberl.spec import JobSpec
from kuberl.spec.colocation import host_of
from kuberl.topology import LinkMatrix, link_class, meets, nccl_p2p_level, pin_devices, plan_groups

log = logs.get("placement")


@dataclass(frozen=True)
class RankPlacement:
    device: int  # GPU index on the node (nvidia-smi / PCI bus order)
    group: tuple[int, ...]  # the GPUs of this rank's group
    worst_link: str  # worst link inside the role's groups on this node ("X" for one GPU)
    nccl_p2p_level: str
    topology_source: str = "none"  # where the links came from: "nvml", "nvidia-smi" (topo -m text) or "none"


def group_size(spec: JobSpec, role: str) -> int:
    """GPUs that must talk fast: the rollout's tensor-parallel group for the actor when it is > 1,
    else one replica's GPUs (its FSDP shard group). A colocated role's ranks pin as its host's do, so rank r
    of each takes the same GPU (they see the same node GPUs in the same order)."""
    role = host_of(spec, role)
    rs = spec.roles.get(role)
    if role == "actor" and spec.rollout.tensor_parallel_size > 1:
        return spec.rollout.tensor_parallel_size
    return max(rs.gpus, 1)


def place_ranks(matrix: LinkMatrix, node_gpus: list[int], k: int) -> list[RankPlacement]:
    """One RankPlacement per local rank (0..len(node_gpus)-1) for ranks sharing `node_gpus`."""
    k = min(k, len(node_gpus))
    plan = plan_groups(matrix, k, sorted(node_gpus))
    worst = plan.worst_link
    level = nccl_p2p_level(worst) if worst != "X" else "LOC"
    out = []
    for local_rank in range(len(node_gpus)):
        group, device = pin_devices(plan, local_rank)
        out.append(RankPlacement(device, tuple(group), worst, level, matrix.source or "none"))
    return out


def worst_link(links: list[str]) -> str | None:
    """The worst of the ranks' worst links (an unknown link counts as worst); None when there are none."""
    from kuberl.topology import link_score

    return min(links, key=lambda level: -1.0 if level == "unknown" else link_score(level)) if links else None


def placement_problem(spec: JobSpec, role: str, worst_link: str | None) -> str | None:
    """A message when `required` placement is violated for `role`, else None."""
    p = spec.placement
    if worst_link is None or worst_link == "X" or p.policy != "required":
        return None
    if worst_link != "unknown" and meets(worst_link, p.min_link):
        return None
    what = "unknown (no NVML or nvidia-smi)" if worst_link == "unknown" else f"{worst_link} ({link_class(worst_link)})"
    return (f"role {role}: worst GPU link {what} is below spec.placement.minLink "
            f"{p.min_link} (fix: schedule the role on nodes whose GPUs are linked by {p.min_link} or better, "
            f"use spec.placement.mode dra, or set spec.placement.policy to preferred)")


def pin_rank(spec: JobSpec, role: str, local_rank: int, node_gpus: list[int]) -> RankPlacement:
    """This rank's placement from the local link matrix; without a readable topology (no NVML and no
    nvidia-smi) the rank takes the local_rank-th GPU in index order and the link is unknown. Logs one line
    saying where the topology came from."""
    from kuberl.topology import TopologyError, read_local

    gpus = sorted(node_gpus)
    try:
        placed = place_ranks(read_local(), gpus, group_size(spec, role))[local_rank]
        what = {"nvml": "NVML", "nvidia-smi": "nvidia-smi topo -m (NVML unavailable)"}[placed.topology_source]
    except TopologyError as exc:
        placed = RankPlacement(gpus[local_rank], tuple(gpus), "unknown", "SYS", "none")
        what = f"nowhere ({exc}): GPUs taken in index order, links unknown"
    log.info(f"{role} rank {local_rank}: GPU topology from {what}; GPU {placed.device}, worst link "
             f"{placed.worst_link}", extra={**logs.STDERR, "role": role, "rank": local_rank})
    return placed

"""Roles that share GPUs (`spec.roles.<role>.colocateWith`), each still its own process.

A colocation set is a host role and the running roles colocated with it; rank r of every role in the set
runs on rank r's GPUs (the spec model checks that they have the same replicas and gpus). On Ray the set
has one placement group, held while any of its roles runs, so that one role's restart leaves the others'
processes and the GPUs where they are; each of the k roles' actors asks its bundle for 1/k of a GPU and
one unit of its own `kuberl_role_<role>` resource (docs/user-guide.md, Colocation).
"""

from __future__ import annotations

from typing import Any

from kuberl.spec import JobSpec, enabled_roles, role_resource
from kuberl.spec.contract import LIVE_RESIZED


def host_of(spec: JobSpec, role: str) -> str:
    """The role whose GPUs `role` runs on: its colocateWith when it runs colocated, else itself."""
    host = spec.roles.get(role).colocate_with
    return host if host is not None and role in enabled_roles(spec) else role


def sharing(spec: JobSpec, role: str) -> tuple[str, ...]:
    """The running roles on `role`'s GPUs, host first, `role` among them; () when it shares them with none."""
    host = host_of(spec, role)
    members = (host, *(r for r in enabled_roles(spec) if r != host and host_of(spec, r) == host))
    return members if len(members) > 1 else ()


def resized_live(spec: JobSpec) -> tuple[str, ...]:
    """The running roles whose replicas change while the job runs (`kuberl.resilience.resize`): the live-resized roles
    that share no GPUs. A colocation set changes size only as a whole, which one role's resize cannot do:
    its roles' replicas are a spec change applied by a restart."""
    return tuple(r for r in LIVE_RESIZED if r in enabled_roles(spec) and not sharing(spec, r))


def gpu_share(spec: JobSpec, role: str) -> float:
    """The fraction of each of its GPUs a rank of `role` asks Ray for: 1/k for k roles sharing them."""
    return 1.0 / max(len(sharing(spec, role)), 1)


def set_bundle(spec: JobSpec, host: str) -> dict[str, float]:
    """One bundle (one rank's share of a replica) of the placement group of `host`'s colocation set: the
    CPUs of every member's rank, one GPU when the roles have GPUs, one unit of each member's role resource."""
    members = sharing(spec, host) or (host,)
    out: dict[str, float] = {"CPU": sum(rank_cpus(spec, r) for r in members)}
    if spec.roles.get(host).gpus:
        out["GPU"] = 1.0
    out.update({role_resource(r): 1.0 for r in members})
    return out


def rank_cpus(spec: JobSpec, role: str) -> float:
    """CPU cores of one rank of `role`: the replica's cores split over its GPUs."""
    rs = spec.roles.get(role)
    return rs.resources.cpu_cores() / max(rs.gpus, 1)


class SharedPlacement:
    """The placement groups of a job's colocation sets, one per host role, shared by the sets' WorkerGroups.

    `acquire(role)` returns the set's placement group (reserving it on first use); `release(role)` says the
    role's actors are gone, and the group is removed once no role of its set holds it. Make one per job
    and give it to every RayWorkerGroup of the job."""

    def __init__(self, spec: JobSpec):
        self.spec = spec
        self.groups: dict[str, Any] = {}  # host role -> its set's placement group
        self.holders: dict[str, set[str]] = {}  # host role -> roles whose actors are in that group

    def acquire(self, role: str, world_size: int) -> Any:
        from ray.util.placement_group import placement_group

        host = host_of(self.spec, role)
        if host not in self.groups:
            bundle = set_bundle(self.spec, host)
            self.groups[host] = placement_group([bundle] * world_size, strategy="PACK",
                                                name=f"kuberl-colocated-{host}-{id(self)}")
        self.holders.setdefault(host, set()).add(role)
        return self.groups[host]

    def release(self, role: str) -> None:
        from ray.util.placement_group import remove_placement_group

        host = host_of(self.spec, role)
        held = self.holders.get(host, set())
        held.discard(role)
        if not held and host in self.groups:
            remove_placement_group(self.groups.pop(host))

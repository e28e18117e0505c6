"""Which roles share which pods (``spec.roles.<role>.colocateWith``): the one rule the operator's worker
groups and the runtime's Ray requests both follow. Pure: the spec model in, names and counts out.

A role colocated with a *host* role runs its ranks on the host's pods; a role that is not colocated is
its own host. On Kubernetes there is one worker group per host (``groupName`` = the host), and its pods
advertise, per role they carry, the role's Ray resource ``role_resource(role)`` with one unit per GPU of
the pod (one on CPU): rank r of every role of the group fits beside rank r of the host, and since each
rank's bundle asks one unit of its own role's resource (``kuberl.groups.RayWorkerGroup.bundle``), Ray still
tells the roles apart: a guest's actors land only on its host's pods, and a host's only on its own.
The spec guarantees the shape this needs (``model.colocation_problems``): a host is a running role that is
not colocated itself, with the guest's replicas and GPUs per replica.
"""

from __future__ import annotations

from .model import JobSpec, enabled_roles, role_resource


def host_of(spec: JobSpec, role: str) -> str:
    """The role whose pods run ``role``'s ranks: its ``colocateWith``, else the role itself."""
    return spec.roles.get(role).colocate_with or role


def hosts(spec: JobSpec) -> list[str]:
    """The running roles that have pods of their own (one worker group each), in `enabled_roles` order."""
    return [role for role in enabled_roles(spec) if host_of(spec, role) == role]


def group_roles(spec: JobSpec, host: str) -> list[str]:
    """The running roles whose ranks run on ``host``'s pods: the host first, then its guests."""
    return [host, *(r for r in enabled_roles(spec) if r != host and host_of(spec, r) == host)]


def pod_role_resources(spec: JobSpec, host: str) -> dict[str, int]:
    """The role resources one pod of ``host``'s group advertises: ``max(gpus, 1)`` units of each role's."""
    units = max(spec.roles.get(host).gpus, 1)
    return {role_resource(role): units for role in group_roles(spec, host)}

"""Roles resized while the job runs (docs/operator.md, "Spec changes"): pure decisions, no API calls.

A change of ``spec.roles.<role>.replicas`` of a role in `live_roles` is applied without a restart of
anything else, in two halves that meet in ConfigMap ``<job>-progress``:

- the operator writes the spec's replicas of those roles into ``data.replicas`` (a `ReplicasDocument`),
  which the driver reads between two steps and applies to the role's WorkerGroup;
- the operator sizes the role's RayCluster worker group: at once when it grows (the driver's new ranks
  wait for the pods), and, when it shrinks, only once the driver reports (``data.progress``,
  ``roles.<role>.replicas``) that it runs the smaller group, naming the pods that no rank of the role
  uses in ``scaleStrategy.workersToDelete``; their deletion is then no failure of the role. KubeRay deletes
  them, not the operator (`status.role_outcome`): KubeRay deletes a random pod for one it finds gone already.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kuberl.spec import RLTrainingJob
from kuberl.spec.colocation import resized_live

from .builders import group_size, replicas_document
from .health import PodView
from .progress import Progress

__all__ = ["cluster_patch", "group_pods", "leaving", "live_fields", "live_roles", "pending", "replicas_document"]


def live_roles(job: RLTrainingJob) -> tuple[str, ...]:
    """The roles of this job resized while it runs (a colocation set's are not: `resized_live`)."""
    return resized_live(job.spec)


def live_fields(job: RLTrainingJob) -> frozenset[str]:
    """The spec fields applied while the job runs (beside spec.suspend)."""
    return frozenset(f"spec.roles.{role}.replicas" for role in live_roles(job))


def running_replicas(role: str, progress: Progress, applied: Mapping[str, Any] | None) -> int | None:
    """The replicas the driver runs of ``role``: its report, else what the RayCluster was built with."""
    reported = progress.replicas_of(role)
    if reported is not None:
        return reported
    built = (((applied or {}).get("roles") or {}).get(role) or {}).get("replicas")
    return built if isinstance(built, int) else None


def group_pods(job: RLTrainingJob, role: str, progress: Progress, applied: Mapping[str, Any] | None,
               current: int | None = None) -> int:
    """The pods the role's worker group should have now: the spec's, or while the driver still runs a
    larger group (a shrink it has not applied yet), that group's, so no rank loses its pod. Never more
    than the spec's or the group's ``current`` size: the report is the driver's, where user code runs, and
    must not grow a group past what admission allowed."""
    want = group_size(job, role)
    running = running_replicas(role, progress, applied)
    if running is None:
        return want
    return min(max(want, running + int(job.spec.standby(role))), max(want, current or 0))


def pending(job: RLTrainingJob, role: str, progress: Progress, applied: Mapping[str, Any] | None) -> bool:
    """Whether the driver has yet to apply the spec's replicas of a live role."""
    running = running_replicas(role, progress, applied)
    return running is not None and running != job.spec.roles.get(role).replicas


def leaving(pods: Sequence[PodView], keep: int, hosts: Sequence[str]) -> tuple[PodView, ...]:
    """The pods to remove so that ``keep`` stay: pods no rank of the role runs on (``hosts``) go first,
    not-ready before ready, then by name; pods already being deleted are not counted."""
    alive = [p for p in pods if not p.deleting and not p.failure]
    order = sorted(alive, key=lambda p: (p.name in hosts, p.ready, p.name))
    return tuple(order[:max(0, len(alive) - keep)])


def cluster_patch(cluster: Mapping[str, Any], pods_by_role: Mapping[str, int],
                  leaving_by_role: Mapping[str, Sequence[str]]) -> list[dict[str, Any]] | None:
    """The JSON patch (RFC 6902) of the RayCluster's ``spec.workerGroupSpecs`` that sizes each role's group; None
    when every group already has its size. Each changed group is addressed by its index, whose ``groupName`` the
    patch tests first (a list changed meanwhile fails the patch instead of resizing another group), so that only
    the groups' sizes need be known (the operator's cache keeps no pod template: ``cache.kept``).
    ``leaving_by_role``: the pods KubeRay deletes (``scaleStrategy.workersToDelete``) as a group shrinks."""
    ops: list[dict[str, Any]] = []
    for i, group in enumerate((cluster.get("spec") or {}).get("workerGroupSpecs") or []):
        role = group.get("groupName")
        if role not in pods_by_role:
            continue
        n, gone = pods_by_role[role], sorted(leaving_by_role.get(role, ()))
        want = {"replicas": n, "minReplicas": n, "maxReplicas": n, "scaleStrategy": {"workersToDelete": gone}}
        if any(group.get(k) != want[k] for k in ("replicas", "minReplicas", "maxReplicas")):
            at = f"/spec/workerGroupSpecs/{i}"
            ops += [{"op": "test", "path": f"{at}/groupName", "value": role},
                    *({"op": "add", "path": f"{at}/{k}", "value": v} for k, v in want.items())]
    return ops or None

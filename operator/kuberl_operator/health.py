"""Pods -> role health: which worker pods are ready, which failed, which must go.

A role restarts as a gang: when one of its pods fails, every pod of that role is deleted (KubeRay
recreates them) and the restart is counted once. Counting is idempotent across re-reconciles and
operator restarts because the job's status remembers, per role, the UIDs of the pods it has seen
alive (``members``, uid -> name: a member that vanishes was deleted) and of the pods already
counted (``handledUIDs``: still listed until they are gone, never counted twice).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import names


@dataclass(frozen=True)
class PodView:
    """What role health needs to know about one pod."""

    name: str
    uid: str
    role: str | None
    owner: str | None  # UID of the controlling owner (the RayCluster that made it)
    ready: bool
    failure: str | None  # why the pod counts as failed, or None
    deleting: bool
    unschedulable: str | None = None  # the scheduler's reason, while the pod waits for a node
    image: str | None = None  # why a container cannot start from its image (ImagePullBackOff, ErrImageNeverPull)


def terminated_failure(statuses: Sequence[Mapping[str, Any]]) -> str | None:
    """A container that terminated non-zero (OOMKilled first: it is the most telling)."""
    found = None
    for cs in statuses:
        term = (cs.get("state") or {}).get("terminated")
        if term and term.get("exitCode", 0) != 0:
            if term.get("reason") == "OOMKilled":
                return f"container {cs.get('name')} OOMKilled"
            found = found or f"container {cs.get('name')} exited with code {term.get('exitCode')}" + (
                f" ({term['reason']})" if term.get("reason") else "")
    return found


def pod_failure(pod: Mapping[str, Any]) -> str | None:
    """Why a worker pod is lost: evicted, failed, a container died, it exited at all, or deleted (the first of
    these that holds: a pod being deleted after its container failed says how it failed)."""
    status = pod.get("status") or {}
    if status.get("reason") == "Evicted":
        return "evicted" + (f": {status['message']}" if status.get("message") else "")
    container = terminated_failure([*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])])
    if container:
        return container
    if status.get("phase") == "Failed":
        disruption = next((c for c in status.get("conditions", []) if c.get("type") == "DisruptionTarget"
                           and c.get("status") == "True"), None)  # e.g. the pod GC's, when the node is gone
        why = status.get("reason") or (disruption and disruption.get("reason"))
        detail = disruption.get("message") if disruption and disruption.get("message") else None
        return "pod failed" + (f" ({why}" + (f": {detail})" if detail else ")") if why else "")
    if status.get("phase") == "Succeeded":
        return "worker exited"  # a Ray worker never finishes on its own
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "deleted"  # after the reasons above: KubeRay deletes a worker pod once it failed
    return node_lost(status)


def node_lost(status: Mapping[str, Any]) -> str | None:
    """A pod on a node that stopped answering: phase Unknown or reason NodeLost (its node's state cannot be
    read), or the node controller's mark on the pods of a NotReady node: Ready False, with no reason, while
    the containers still report ready (the kubelet, when it is the one to set Ready False, gives a reason).
    Its processes may still run, but no one can reach them: the pod is lost."""
    if status.get("phase") == "Unknown" or status.get("reason") == "NodeLost":
        return "node lost (pod phase Unknown)" + (f": {status['message']}" if status.get("message") else "")
    ready = next((c for c in status.get("conditions", []) if c.get("type") == "Ready"), None)
    containers = status.get("containerStatuses") or []
    if (status.get("phase") == "Running" and ready and ready.get("status") == "False" and not ready.get("reason")
            and containers and all(cs.get("ready") for cs in containers)):
        return "node lost (node NotReady: the node controller marked the pod not ready)"
    return None


def unschedulable(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message while no node fits the pod: its PodScheduled condition False, reason
    Unschedulable (e.g. "0/6 nodes are available: 6 node(s) didn't match Pod's node affinity/selector.")."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending"):
        return None
    cond = next((c for c in status.get("conditions", []) if c.get("type") == "PodScheduled"), None)
    if cond is None or cond.get("status") != "False" or cond.get("reason") != "Unschedulable":
        return None
    return cond.get("message") or "Unschedulable"


IMAGE_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"})


def image_waiting(pod: Mapping[str, Any]) -> str | None:
    """A container the kubelet cannot start from its image, in its words: "container ray-worker: ErrImageNeverPull
    (Container image "x" is not present with pull policy of Never)". None when every image is there."""
    status = pod.get("status") or {}
    for cs in (*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_REASONS:
            detail = f" ({waiting['message']})" if waiting.get("message") else ""
            return f"container {cs.get('name')}: {waiting['reason']}{detail}"
    return None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
    return status.get("phase") == "Running" and ready


def pod_view(pod: Mapping[str, Any]) -> PodView:
    meta = pod.get("metadata") or {}
    owners = [o for o in meta.get("ownerReferences", []) if o.get("controller")]
    return PodView(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        role=(meta.get("labels") or {}).get(names.LABEL_ROLE),
        owner=owners[0].get("uid") if owners else None,
        ready=pod_ready(pod),
        failure=pod_failure(pod),
        deleting=bool(meta.get("deletionTimestamp")),
        unschedulable=unschedulable(pod),
        image=image_waiting(pod),
    )


@dataclass(frozen=True)
class Tracking:
    """Per-role memory kept in status: pods seen alive (uid -> name), and pods already counted."""

    members: Mapping[str, str] = field(default_factory=dict)
    handled: frozenset[str] = frozenset()

    @classmethod
    def from_status(cls, role_status: Mapping[str, Any]) -> Tracking:
        return cls(dict(role_status.get("members") or {}), frozenset(role_status.get("handledUIDs", [])))

    def to_status(self) -> dict[str, Any]:
        return {"members": dict(sorted(self.members.items())), "handledUIDs": sorted(self.handled)}


@dataclass(frozen=True)
class RoleHealth:
    ready: int
    failures: tuple[str, ...]  # new failures, one line each: "pod NAME: REASON"
    tracking: Tracking
    doomed: tuple[str, ...]  # names of pods to delete now (the rest of the gang, and failed pods)


@dataclass
class LastWords:
    """How pods that are gone had failed, by UID, from their final state (a DELETED event's body): KubeRay deletes a
    worker pod once it failed, and under load the pod can be gone before a pass saw it failed. Only the newest
    ``keep`` are kept; a process that restarts has none (its vanished members are then just "deleted")."""

    keep: int = 4096
    words: dict[str, str] = field(default_factory=dict)

    def note(self, uid: str, failure: str | None) -> None:
        if uid and failure and failure != "deleted":
            self.words[uid] = failure
            while len(self.words) > self.keep:
                del self.words[next(iter(self.words))]


def assess_role(pods: Sequence[PodView], tracking: Tracking, gang: bool = True,
                gone: Mapping[str, str] | None = None) -> RoleHealth:
    """Count new failures of one role's pods and say which pods must go.

    ``pods`` are the role's pods of the current RayCluster. A new failure is a failed pod that is not handled yet,
    or a member that vanished (named by how it failed where ``gone``, uid -> failure, knows it). On any new
    failure the gang, every member and every failed pod, is handled (and so deleted): the role restarts as a gang,
    counted once however many pods failed. A pod that is neither (KubeRay's replacement of the failed one, made
    since the last pass) joined after the failure and is spared: deleting KubeRay's brand-new pod stalls its group
    for minutes (its scale expectations wait for a pod it never saw).

    Without ``gang`` (a role with a standby pod), only the failed pods go: the standby takes their
    place in the role, the others stay, and KubeRay's replacement becomes the next standby.
    """
    current = {p.uid: p for p in pods}
    failures = [f"pod {p.name}: {p.failure}" for p in pods if p.failure and p.uid not in tracking.handled]
    failures += [f"pod {name}: {(gone or {}).get(uid, 'deleted')}"
                 for uid, name in sorted(tracking.members.items(), key=lambda m: m[1])
                 if uid not in current and uid not in tracking.handled]
    doomed_now = {uid for uid, p in current.items() if (gang and uid in tracking.members) or p.failure}
    handled = (tracking.handled | (doomed_now if failures else set())) & current.keys()
    members = {p.uid: p.name for p in pods if not p.failure and p.uid not in handled}
    doomed = tuple(sorted(p.name for p in pods if p.uid in handled and not p.deleting))
    ready = sum(1 for p in pods if p.ready and not p.failure and p.uid not in handled)
    return RoleHealth(ready, tuple(failures), Tracking(members, frozenset(handled)), doomed)

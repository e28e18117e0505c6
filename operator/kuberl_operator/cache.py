"""What the operator knows of the API's objects without asking: watch-backed indices, and its own writes.

kopf keeps one index per watched kind (``handlers.py``: the jobs, and every kind a job owns, selected by the
``kuberl.io/job`` label), each keyed by ``(namespace, name)`` and filled from a list and then a watch, so a
reconcile reads what it needs from memory instead of GETting it. An object this process just wrote is newer than
its index until the watch event of the write arrives (milliseconds, at most a few seconds on a busy server): the
body each write returned is kept in ``Written`` and wins while its ``resourceVersion`` is the newer one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Key = tuple[str, str, str]  # (plural, namespace, name)


def version(obj: Mapping[str, Any] | None) -> int:
    """An object's resourceVersion as a number (etcd's revision; -1 when absent or not a number)."""
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion", -1))
    except (TypeError, ValueError):
        return -1


def newest(indexed: Mapping[str, Any] | None, written: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The newer of an object as its index holds it and as this process last wrote it. A write the index has
    caught up with (same or newer version) loses; one the index does not hold yet wins."""
    if written is None:
        return indexed
    if indexed is None:
        return written
    return written if version(written) > version(indexed) else indexed


@dataclass
class Written:
    """The bodies this process's writes (create, patch) returned, until the indices catch up."""

    bodies: dict[Key, Mapping[str, Any]] = field(default_factory=dict)

    def put(self, plural: str, body: Mapping[str, Any] | None) -> None:
        if body and (meta := body.get("metadata")):
            self.bodies[(plural, meta["namespace"], meta["name"])] = kept(plural, body)

    def read(self, plural: str, namespace: str, name: str, indexed: Mapping[str, Any] | None) -> Any:
        """The newest of `indexed` and the written body; the written one is dropped once the index has it."""
        key = (plural, namespace, name)
        best = newest(indexed, self.bodies.get(key))
        if best is indexed:
            self.bodies.pop(key, None)
        return best

    def drop(self, plural: str, namespace: str, name: str) -> None:
        """Forget an object that was deleted (its watch said so)."""
        self.bodies.pop((plural, namespace, name), None)

    def forget(self, namespace: str, job: str, names: tuple[str, ...]) -> None:
        """Drop what is kept of a deleted job's objects (`names`: theirs, the job's own included)."""
        for key in [k for k in self.bodies if k[1] == namespace and k[2] in (job, *names)]:
            del self.bodies[key]


GROUP_KEYS = ("groupName", "replicas", "minReplicas", "maxReplicas", "scaleStrategy")  # a worker group's sizes


def kept(plural: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """What the cache keeps of an object of kind `plural`: its metadata (less managedFields) and what a reconcile
    reads of that kind: a job whole, a ConfigMap's data, a RayCluster's worker group sizes (``GROUP_KEYS``); of
    the other kinds (ServiceAccount, Role, RoleBinding, batch Job, ResourceClaimTemplate) the metadata only
    (ownership, deletion). A RayCluster's pod templates and a batch Job's are most of a job's children's size
    (about 95 KiB a job as Python objects), which 1,000 jobs would keep in memory for nothing."""
    meta = {k: v for k, v in body["metadata"].items() if k != "managedFields"}
    if plural == "rltrainingjobs":
        return {**body, "metadata": meta}
    out: dict[str, Any] = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "metadata": meta}
    if plural == "configmaps" and "data" in body:
        out["data"] = body["data"]
    if plural == "rayclusters":
        groups = (body.get("spec") or {}).get("workerGroupSpecs") or []
        out["spec"] = {"workerGroupSpecs": [{k: g[k] for k in GROUP_KEYS if k in g} for g in groups],
                       "suspend": bool((body.get("spec") or {}).get("suspend"))}  # Kueue's hold on it
    return out


def first(store: Any) -> Mapping[str, Any] | None:
    """The one value a kopf index holds under a key (one object per namespace and name), or None."""
    return next(iter(store), None) if store is not None else None

"""Make a pod fail the way a kubelet would report it (kwok's stages, cluster/localkube/kwok-stages.yaml),
or take it away (delete the pod, delete its node)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from localkube.api import NODES, PODS, Api

# how -> the annotations that kwok's stages act on
EXITS = {
    "exit": {"kwok.kuberl.io/exit-code": "1"},  # a non-zero exit (reason Error)
    "oom": {"kwok.kuberl.io/exit-code": "137", "kwok.kuberl.io/reason": "OOMKilled"},
    "evicted": {"kwok.kuberl.io/evict": "The node was low on resource: memory."},
}
HOWS = (*EXITS, "deleted", "node-deleted")


def long_ago() -> dict[str, str]:
    """With an exit or an eviction: the pod ended an hour ago, as kwok then reports it. A Job's controller retries
    such a pod at once: its pod failure backoff (10 s, doubling with each failure) is over."""
    return {"kwok.kuberl.io/finished-at": (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")}


def exit_with(api: Api, pod: str, code: int, reason: str | None = None, ended: dict[str, str] | None = None) -> None:
    """The pod's containers terminate with ``code`` (0: phase Succeeded, else Failed); ``ended``: `long_ago()`."""
    annotations = {"kwok.kuberl.io/exit-code": str(code)} | ({"kwok.kuberl.io/reason": reason} if reason else {})
    api.patch(PODS, pod, {"metadata": {"annotations": annotations | (ended or {})}})


def fail_pod(api: Api, pod: str, how: str) -> None:
    """exit | oom | evicted (kwok reports it), deleted (DELETE), node-deleted (its Node is deleted;
    the pod-garbage collector then removes the orphan)."""
    if how in EXITS:
        api.patch(PODS, pod, {"metadata": {"annotations": EXITS[how]}})
    elif how == "deleted":
        api.delete(PODS, pod)
    elif how == "node-deleted":
        node = api.get(PODS, pod)["spec"]["nodeName"]
        api.delete(NODES, node, namespace=None)
    else:
        raise ValueError(f"unknown failure {how!r}; one of {HOWS}")


def cordon(api: Api, node: str, unschedulable: bool = True) -> None:
    api.patch(NODES, node, {"spec": {"unschedulable": unschedulable or None}}, namespace=None)

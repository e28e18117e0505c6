"""Play KubeRay and the kubelet in tests: make a RayCluster's pods, run them, break them.

What a test does here is what those controllers would do: pods are created from the group
templates with KubeRay's labels and an owner reference to the RayCluster, then their status is
patched through the status subresource, like a kubelet.
"""

from __future__ import annotations

import secrets
from typing import Any

from .client import PODS, RAYCLUSTERS, Client

RUNNING = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


def pod_for(cluster: dict[str, Any], group: str, node_type: str, template: dict[str, Any]) -> dict[str, Any]:
    name = cluster["metadata"]["name"]
    labels = {**template.get("metadata", {}).get("labels", {}),
              "ray.io/cluster": name, "ray.io/group": group, "ray.io/node-type": node_type}
    owner = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": name,
             "uid": cluster["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-{group}-{node_type}-{secrets.token_hex(3)}", "labels": labels,
                     "ownerReferences": [owner]},
        "spec": template["spec"],
    }


def pods_of(api: Client, cluster: str, group: str | None = None) -> list[dict[str, Any]]:
    selector = f"ray.io/cluster={cluster}" + (f",ray.io/group={group}" if group else "")
    return api.list(PODS, selector)


def sync(api: Client, cluster_name: str) -> list[dict[str, Any]]:
    """KubeRay's reconcile: top up every group to its replicas, and run the new pods."""
    cluster = api.get(RAYCLUSTERS, cluster_name)
    assert cluster is not None, f"RayCluster {cluster_name} does not exist"
    groups = [("headgroup", "head", 1, cluster["spec"]["headGroupSpec"]["template"])]
    groups += [(g["groupName"], "worker", g["replicas"], g["template"]) for g in cluster["spec"]["workerGroupSpecs"]]
    for group, node_type, replicas, template in groups:
        alive = [p for p in pods_of(api, cluster_name, group) if p.get("status", {}).get("phase") not in ("Failed", "Succeeded")]
        for _ in range(replicas - len(alive)):
            pod = api.create(PODS, pod_for(cluster, group, node_type, template))
            api.patch(PODS, pod["metadata"]["name"], {"status": RUNNING}, sub="status")
    return pods_of(api, cluster_name)


def fail(api: Client, pod: str, how: str) -> None:
    """Break a pod the way a node would: oom, error, evicted, failed, or deleted."""
    if how == "deleted":
        api.delete(PODS, pod)
        return
    terminated = {"oom": {"exitCode": 137, "reason": "OOMKilled"}, "error": {"exitCode": 1, "reason": "Error"}}
    status: dict[str, Any] = {"phase": "Failed", "conditions": [{"type": "Ready", "status": "False"}]}
    if how in terminated:
        status["containerStatuses"] = [{
            "name": "ray-worker", "ready": False, "restartCount": 0, "image": "ray", "imageID": "",
            "state": {"terminated": terminated[how]},
        }]
    elif how == "evicted":
        status.update(reason="Evicted", message="The node was low on resource: memory.")
    api.patch(PODS, pod, {"status": status}, sub="status")

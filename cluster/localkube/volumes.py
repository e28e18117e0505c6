"""Storage on the real node: a StorageClass and hostPath PersistentVolumes under the node's state folder.

A job's `spec.trainer.checkpoint.volumeClaim` needs a ReadWriteMany claim that every pod of the job mounts
(checkpoints, the per-step snapshots, the driver's metrics.jsonl and reward curve). On one node a hostPath
volume is that: the pods of a job all run on ``node-0``, so they all see the same folder. There is no
provisioner: the stack makes ``COUNT`` volumes of class ``kuberl-local`` up front, each a folder
``<state>/node/volumes/<n>`` owned by the images' user, and a claim of that class binds one of them. The
folders stay where they are after the job, and after `make cluster-down` (Retain), so `kuberl export`
reads the checkpoints from there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from . import api as kapi

STORAGE_CLASS = "kuberl-local"
COUNT = 4  # claims a session on this node can bind (a Released volume is not bound again: Retain)
SIZE = "20Gi"
IMAGE_UID = 1000  # the images' user (images/*/Dockerfile USER): the pods write as it


def storage_class() -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": STORAGE_CLASS},
            "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "Immediate",
            "reclaimPolicy": "Retain"}


def persistent_volume(name: str, path: Path, size: str = SIZE) -> dict[str, Any]:
    """A ReadWriteMany hostPath volume of the class at `path`, on the real node only."""
    node_only = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kuberl.io/real-node", "operator": "In", "values": ["true"]}]}]}}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteMany"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": STORAGE_CLASS,
                     "hostPath": {"path": str(path), "type": "Directory"}, "nodeAffinity": node_only}}


def folder(node_dir: Path, index: int) -> Path:
    """Volume `index`'s folder, made (mode 0770, the images' user) if missing."""
    path = node_dir / "volumes" / str(index)
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, IMAGE_UID, IMAGE_UID)
    path.chmod(0o770)
    return path


def apply(admin: kapi.Api, node_dir: Path, count: int = COUNT) -> list[Path]:
    """The class and `count` volumes (`kuberl-local-<n>`); their folders."""
    admin.apply(kapi.STORAGECLASSES, STORAGE_CLASS, json.dumps(storage_class()), namespace=None)
    paths = [folder(node_dir, i) for i in range(count)]
    for i, path in enumerate(paths):
        admin.apply(kapi.PERSISTENTVOLUMES, f"{STORAGE_CLASS}-{i}", json.dumps(persistent_volume(
            f"{STORAGE_CLASS}-{i}", path)), namespace=None)
    return paths


def claim(name: str, size: str = "1Gi") -> dict[str, Any]:
    """A claim a job names in `spec.trainer.checkpoint.volumeClaim` (apply it in the job's namespace)."""
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": STORAGE_CLASS,
                     "resources": {"requests": {"storage": size}}}}

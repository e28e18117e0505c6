"""Fake nodes for kwok: capacity (``nvidia.com/gpu`` included), labels and taints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GPU = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}  # as GPU node pools usually are


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cpu: str = "64"
    memory: str = "512Gi"
    storage: str = "2Ti"  # ephemeral-storage: the node's local disk (a job's containers request some)
    gpus: int = 0
    pods: int = 110
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()


def gpu_node(name: str, gpus: int = 8, product: str = "NVIDIA-H200", **kw: Any) -> NodeSpec:
    """A GPU node: ``gpus`` of ``product`` (label nvidia.com/gpu.product), tainted for GPU pods only."""
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus), **kw.pop("labels", {})}
    return NodeSpec(name, gpus=gpus, labels=labels, taints=kw.pop("taints", (GPU_TAINT,)), **kw)


DEFAULT_NODES = (NodeSpec("cpu-0"), gpu_node("gpu-0"), gpu_node("gpu-1"))


def node_object(spec: NodeSpec) -> dict[str, Any]:
    capacity = {"cpu": spec.cpu, "memory": spec.memory, "ephemeral-storage": spec.storage, "pods": str(spec.pods)}
    if spec.gpus:
        capacity[GPU] = str(spec.gpus)
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        **spec.labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"taints": [dict(t) for t in spec.taints]},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }

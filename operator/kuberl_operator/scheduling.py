"""A role's scheduling fields -> its worker pods' nodeSelector, tolerations, affinity, priority and runtime class.

Pure: the builders merge the result into the role's pod template (``worker_group``).
"""

from __future__ import annotations

from typing import Any

from kuberl.spec import RoleSpec

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}  # GPU pools' usual taint


def pod_scheduling(spec: RoleSpec) -> dict[str, Any]:
    """The pod-spec fields for one role's pods (only those that are set). A GPU role always tolerates
    the ``nvidia.com/gpu`` taint; gpuProduct becomes nodeSelector ``nvidia.com/gpu.product``."""
    out: dict[str, Any] = {}
    if labels := spec.node_labels():
        out["nodeSelector"] = labels
    tolerations = [GPU_TOLERATION] if spec.gpus else []
    tolerations += [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    if tolerations:
        out["tolerations"] = tolerations
    if spec.affinity is not None:
        out["affinity"] = spec.affinity.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)
    if spec.priority_class_name:
        out["priorityClassName"] = spec.priority_class_name
    if spec.runtime_class_name:
        out["runtimeClassName"] = spec.runtime_class_name
    return out

"""DRA on the real node: our fake-GPU driver (cluster/gomod/fakegpu, built like the rest) and what it needs.

The driver runs beside the kubelet, in the node's namespace, as the client ``kuberl:fake-gpu``: it registers with
the kubelet, publishes ``GPUS`` fake GPUs of ``node-0`` in a ResourceSlice, each with the standard
``resource.kubernetes.io/pcieRoot`` attribute (the first half under ``PCIE_ROOTS[0]``, the rest under the second),
and prepares the claims allocated from them. A job with ``placement.mode: dra`` and
``placement.deviceClass: fake-gpu.kuberl.io`` gets its claims allocated there, and its pods start.
"""

from __future__ import annotations

from typing import Any

DRIVER = DEVICE_CLASS = "fake-gpu.kuberl.io"
GPUS = 8
PCIE_ROOTS = ("pci0000:00", "pci0000:80")
USER = "kuberl:fake-gpu"  # pki.CLIENTS["fake-gpu"]


def rbac() -> tuple[dict[str, Any], dict[str, Any]]:
    """What a DRA driver's node plugin does with the API: its ResourceSlices, the claims it prepares, its node."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": USER},
            "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
                       "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]},
                      {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
                       "verbs": ["get", "list", "watch"]},
                      {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": USER},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": USER},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]}
    return role, binding


def device_class() -> dict[str, Any]:
    """The DeviceClass a job names in spec.placement.deviceClass: every device of this driver."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}


def argv(binary: str, kubeconfig: str, node: str, kubelet_root: str) -> list[str]:
    return [binary, f"--kubeconfig={kubeconfig}", f"--node-name={node}", f"--driver-name={DRIVER}",
            f"--kubelet-root-dir={kubelet_root}", f"--gpus={GPUS}", f"--pcie-roots={','.join(PCIE_ROOTS)}"]

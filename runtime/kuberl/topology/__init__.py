"""GPU link topology: read the link matrix (nvidia-smi or NVML), rank links, plan GPU groups.

Pure Python: pynvml is imported only inside :func:`read_nvml`.
"""

from kuberl.topology.matrix import (
    LINK_ORDER,
    LinkMatrix,
    TopologyError,
    link_class,
    link_score,
    meets,
    nccl_p2p_level,
)
from kuberl.topology.nvml import read_local, read_nvml
from kuberl.topology.parse import parse_nvidia_smi_topo
from kuberl.topology.plan import Plan, pin_devices, plan_groups

__all__ = [
    "LINK_ORDER",
    "LinkMatrix",
    "Plan",
    "TopologyError",
    "link_class",
    "link_score",
    "meets",
    "nccl_p2p_level",
    "parse_nvidia_smi_topo",
    "pin_devices",
    "plan_groups",
    "read_local",
    "read_nvml",
]

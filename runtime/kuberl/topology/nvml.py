"""Read the local machine's link matrix through NVML, or ``nvidia-smi topo -m`` as a fallback."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from typing import Any

from kuberl.topology.matrix import SELF, LinkMatrix, TopologyError, format_id_list
from kuberl.topology.parse import parse_nvidia_smi_topo

# nvmlGpuTopologyLevel_t -> nvidia-smi level. INTERNAL (two GPUs on one board) is shown as PIX by
# nvidia-smi: the board's own PCIe switch joins them.
_ANCESTOR = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
_NVML_AFFINITY_SCOPE_NODE = 0
_NODE_SET_WORDS = 4  # 256 NUMA nodes


def read_nvml() -> LinkMatrix:
    """The link matrix of every GPU NVML sees (pynvml, from nvidia-ml-py)."""
    try:
        import pynvml
    except ImportError:
        raise TopologyError("pynvml is not installed (pip install nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise TopologyError(f"NVML failed to initialise: {e}") from None
    try:
        return _read(pynvml)
    except pynvml.NVMLError as e:
        raise TopologyError(f"NVML query failed: {e}") from None
    finally:
        pynvml.nvmlShutdown()


def read_local() -> LinkMatrix:
    """The local link matrix: NVML when it works, else ``nvidia-smi topo -m`` (``source`` says which)."""
    try:
        return read_nvml()
    except TopologyError as e:
        nvml_error = str(e)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise TopologyError(
            f"no NVIDIA GPU found: neither NVML nor nvidia-smi is available (NVML: {nvml_error})"
        )
    try:
        done = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TopologyError(f"nvidia-smi topo -m could not run: {e}") from None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise TopologyError(f"nvidia-smi topo -m exited {done.returncode}: {why[0] if why else 'no output'}")
    return parse_nvidia_smi_topo(done.stdout)


def _read(nv: Any) -> LinkMatrix:
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    if not handles:
        raise TopologyError("NVML found no GPUs")
    n = len(handles)
    direct, switch = _nvlinks(nv, handles)
    links = [[SELF] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            count = direct[i][j] + min(switch[i], switch[j])
            level = f"NV{count}" if count else _ANCESTOR[nv.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])]
            links[i][j] = links[j][i] = level
    return LinkMatrix(
        names=[f"GPU{i}" for i in range(n)],
        indices=list(range(n)),
        links=links,
        cpu_affinity=[_cpu_affinity(nv, h) for h in handles],
        numa_affinity=[_numa_affinity(nv, h) for h in handles],
        source="nvml",
    )


def _nvlinks(nv: Any, handles: list[Any]) -> tuple[list[list[int]], list[int]]:
    """Active NVLinks: GPU-to-GPU counts, and per GPU the number of links to NVSwitches.

    Two GPUs that both reach NVSwitches are joined by min(their switch links), as nvidia-smi shows
    (NV18 on an 8-GPU H100 board). Where the driver cannot name the remote device type, a remote that
    is not one of our GPUs is taken to be a switch.
    """
    n = len(handles)
    bus = {_bus_key(nv.nvmlDeviceGetPciInfo(h).busId): i for i, h in enumerate(handles)}
    direct = [[0] * n for _ in range(n)]
    switch = [0] * n
    for i, h in enumerate(handles):
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                if nv.nvmlDeviceGetNvLinkState(h, link) != nv.NVML_FEATURE_ENABLED:
                    continue
                remote = bus.get(_bus_key(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId))
            except nv.NVMLError:
                continue  # no such link, or NVLink unsupported on this GPU
            if remote is not None:
                direct[i][remote] += 1
            elif _remote_is_switch(nv, h, link):
                switch[i] += 1
    return direct, switch


def _remote_is_switch(nv: Any, handle: Any, link: int) -> bool:
    try:
        return nv.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link) == _NVML_NVLINK_DEVICE_TYPE_SWITCH
    except (AttributeError, nv.NVMLError):
        return True


def _bus_key(bus_id: bytes | str) -> tuple[int, int, int, int]:
    """``"00000000:18:00.0"`` or ``"0000:18:00.0"`` -> (domain, bus, device, function)."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    domain, bus, rest = text.strip().split(":")
    device, function = rest.split(".")
    return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)


def _cpu_affinity(nv: Any, handle: Any) -> str | None:
    words = (os.cpu_count() or 1) // 64 + 1
    try:
        return _bitmask_ids(nv.nvmlDeviceGetCpuAffinity(handle, words)) or None
    except nv.NVMLError:
        return None


def _numa_affinity(nv: Any, handle: Any) -> str | None:
    """The host NUMA node(s) near the GPU (nvidia-smi's "NUMA Affinity" column)."""
    try:
        mask = nv.nvmlDeviceGetMemoryAffinity(handle, _NODE_SET_WORDS, _NVML_AFFINITY_SCOPE_NODE)
    except (AttributeError, nv.NVMLError):
        return None
    return _bitmask_ids(mask) or None


def _bitmask_ids(words: Iterable[int]) -> str:
    """Format an array of 64-bit mask words as an id list."""
    return format_id_list(w * 64 + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1)

"""The GPU link matrix and the ranking of link levels.

Levels are the strings ``nvidia-smi topo -m`` prints: ``X`` (self), ``NV<n>`` (a bonded set of n
NVLinks), then the PCIe/CPU path classes ``PIX > PXB > PHB > NODE > SYS`` (best first).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

LINK_ORDER = ["NV", "PIX", "PXB", "PHB", "NODE", "SYS"]
"""Link classes, best first."""

SELF = "X"
_ALIASES = {"SOC": "SYS"}  # nvidia-smi before 2017 printed SOC for what is now SYS
_NV = re.compile(r"NV(\d*)")

# NCCL_P2P_LEVEL names the furthest path on which NCCL still uses P2P. NCCL has no NODE level: its
# topology joins every host bridge of one NUMA node at one CPU node, so a nvidia-smi NODE path (across
# host bridges, within a NUMA node) is an NCCL PHB path ("same NUMA node, traffic through the CPU").
_NCCL_P2P = {SELF: "LOC", "NV": "NVL", "PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "PHB", "SYS": "SYS"}


class TopologyError(ValueError):
    """Topology input is malformed or unavailable; the message is a single line."""


def link_class(level: str) -> str:
    """The class of a link level: ``"NV18"`` -> ``"NV"``, ``"PIX"`` -> ``"PIX"``, ``"X"`` -> ``"X"``."""
    text = level.strip().upper()
    if text == SELF:
        return SELF
    if _NV.fullmatch(text):
        return "NV"
    text = _ALIASES.get(text, text)
    if text in LINK_ORDER:
        return text
    raise TopologyError(f"unknown link level {level!r}")


def is_link_level(token: str) -> bool:
    """Whether ``token`` is a link level ``link_class`` understands."""
    try:
        link_class(token)
    except TopologyError:
        return False
    return True


def link_score(level: str) -> float:
    """Quality of a link, higher is better: SYS 1, NODE 2, PHB 3, PXB 4, PIX 5, NV<n> 5+n.

    A bare ``"NV"`` counts as one link, so ``meets(x, "NV")`` means "any NVLink". ``X`` (a GPU to
    itself) scores +inf.
    """
    cls = link_class(level)
    if cls == SELF:
        return math.inf
    if cls == "NV":
        count = _NV.fullmatch(level.strip().upper()).group(1)  # type: ignore[union-attr]
        return float(len(LINK_ORDER) - 1 + (int(count) if count else 1))
    return float(len(LINK_ORDER) - LINK_ORDER.index(cls))


def meets(level: str, min_link: str) -> bool:
    """Whether ``level`` is at least as good as ``min_link`` (``"NV8"`` needs 8 or more NVLinks)."""
    return link_score(level) >= link_score(min_link)


def nccl_p2p_level(worst_link: str) -> str:
    """The ``NCCL_P2P_LEVEL`` that lets NCCL use P2P over every link up to ``worst_link``.

    X -> LOC (no peer), NV<n> -> NVL, PIX/PXB/PHB -> same name, NODE -> PHB (NCCL has no NODE level;
    it counts such paths as PHB), SYS -> SYS.
    """
    return _NCCL_P2P[link_class(worst_link)]


def parse_id_list(text: str | None) -> set[int] | None:
    """Parse a Linux id list such as ``"0-47,96-143"``; ``None`` for ``None``/``"N/A"``/empty."""
    if text is None or text.strip().upper() in ("", "N/A"):
        return None
    ids: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        try:
            ids.update(range(int(low), int(high or low) + 1))
        except ValueError:
            raise TopologyError(f"bad id list {text!r}") from None
    return ids


def format_id_list(ids: Iterable[int]) -> str:
    """Format ids as a Linux id list: ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    runs: list[list[int]] = []
    for i in sorted(set(ids)):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


@dataclass
class LinkMatrix:
    """Links between the GPUs of one machine.

    ``links[i][j]`` is the level between the GPUs at positions ``i`` and ``j`` (``X`` on the
    diagonal); ``indices[i]`` is the GPU index of position ``i`` (nvidia-smi/NVML order, i.e. PCI bus
    order). ``cpu_affinity``/``numa_affinity`` hold the raw id lists (``"0-47,96-143"``, ``"0"``), or
    ``None`` where unknown. ``source`` says where the links were read: ``"nvml"`` or ``"nvidia-smi"``
    (the text of ``nvidia-smi topo -m``); empty for a matrix built by hand.
    """

    names: list[str]
    indices: list[int]
    links: list[list[str]]
    cpu_affinity: list[str | None]
    numa_affinity: list[str | None]
    source: str = ""

    def __post_init__(self) -> None:
        n = len(self.names)
        if n == 0:
            raise TopologyError("the link matrix has no GPUs")
        for field in ("indices", "links", "cpu_affinity", "numa_affinity"):
            if len(getattr(self, field)) != n:
                raise TopologyError(f"{field} has {len(getattr(self, field))} entries for {n} GPUs")
        if len(set(self.indices)) != n:
            raise TopologyError(f"duplicate GPU indices {self.indices}")
        for i, row in enumerate(self.links):
            if len(row) != n:
                raise TopologyError(f"{self.names[i]} has {len(row)} links, expected {n}")
            for j, level in enumerate(row):
                self._check_cell(i, j, level)

    def _check_cell(self, i: int, j: int, level: str) -> None:
        a, b = self.names[i], self.names[j]
        cls = link_class(level)
        if (cls == SELF) != (i == j):
            where = "its own column" if i == j else f"column {b}"
            raise TopologyError(f"row {a} has {level!r} in {where}; X belongs exactly on the diagonal")
        if level != self.links[j][i]:
            raise TopologyError(f"asymmetric links: {a}-{b} is {level} but {b}-{a} is {self.links[j][i]}")

    @property
    def size(self) -> int:
        """Number of GPUs."""
        return len(self.names)

    def position(self, index: int) -> int:
        """The matrix position of GPU ``index``."""
        try:
            return self.indices.index(index)
        except ValueError:
            have = ",".join(map(str, self.indices))
            raise TopologyError(f"GPU {index} is not in the topology (have GPUs {have})") from None

    def link(self, a: int, b: int) -> str:
        """The link level between GPU indices ``a`` and ``b``."""
        return self.links[self.position(a)][self.position(b)]

    def numa_node(self, index: int) -> int | None:
        """The one NUMA node GPU ``index`` is attached to; ``None`` when unknown or ambiguous ("0-1")."""
        nodes = parse_id_list(self.numa_affinity[self.position(index)])
        return next(iter(nodes)) if nodes is not None and len(nodes) == 1 else None

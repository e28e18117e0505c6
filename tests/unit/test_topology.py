"""GPU topology: parsing real `nvidia-smi topo -m` captures, link ranking, group planning, NVML, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from kuberl.topology import (
    LINK_ORDER,
    LinkMatrix,
    Plan,
    TopologyError,
    link_class,
    link_score,
    meets,
    nccl_p2p_level,
    parse_nvidia_smi_topo,
    pin_devices,
    plan_groups,
    read_local,
    read_nvml,
)
from kuberl.topology import plan as plan_module
from kuberl.topology.matrix import format_id_list, parse_id_list

REPO = Path(__file__).resolve().parents[2]
TOPO = REPO.parent / "shared" / "fixtures" / "topo"
CAPTURES = {
    "dgx_h100_nvswitch_nv18.txt",
    "h200_single_gpu.txt",
    "pcie_2gpu_5090_phb_workstation.txt",
    "pcie_4gpu_rtx8000_all_sys.txt",
    "pcie_8gpu_plx_pix_pxb_sys.txt",
}


def capture(name: str) -> Path:
    path = TOPO / name
    if not path.is_file():
        pytest.skip(f"{path} not present: the real nvidia-smi captures live in shared/fixtures/topo")
    return path


def parsed(name: str) -> LinkMatrix:
    return parse_nvidia_smi_topo(capture(name).read_text())


def groups(m: LinkMatrix, k: int, gpus: list[int] | None = None) -> tuple[list[list[int]], str]:
    plan = plan_groups(m, k, gpus)
    return plan.groups, plan.worst_link


def synthetic(links: list[list[str]], numa: list[str | None] | None = None) -> LinkMatrix:
    n = len(links)
    return LinkMatrix(
        names=[f"GPU{i}" for i in range(n)],
        indices=list(range(n)),
        links=links,
        cpu_affinity=[None] * n,
        numa_affinity=numa or [None] * n,
    )


def uniform(n: int, level: str) -> list[list[str]]:
    return [["X" if i == j else level for j in range(n)] for i in range(n)]


# --- real captures -------------------------------------------------------------------------------


def test_every_capture_has_expectations() -> None:
    if not TOPO.is_dir():
        pytest.skip(f"{TOPO} not present: the real nvidia-smi captures live in shared/fixtures/topo")
    found = {p.name for p in TOPO.glob("*.txt")}
    assert found == CAPTURES, "add a test (and expected plans) for each new capture"
    for name in sorted(found):
        parsed(name)


def test_dgx_h100_nvswitch() -> None:
    m = parsed("dgx_h100_nvswitch_nv18.txt")
    # 13 NIC columns/rows are dropped; only the 8 GPUs remain.
    assert m.names == [f"GPU{i}" for i in range(8)] and m.indices == list(range(8))
    assert m.link(0, 0) == "X" and m.link(0, 7) == "NV18" and m.link(5, 2) == "NV18"
    assert m.cpu_affinity[0] == "0-55,112-167" and m.cpu_affinity[7] == "56-111,168-223"
    assert [m.numa_node(g) for g in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    # Every pair is NV18 (all GPUs hang off the NVSwitches), so links cannot tell groupings apart:
    # the NUMA rule keeps groups inside socket 0 (GPU0-3) or socket 1 (GPU4-7), and lowest indices
    # break the remaining ties.
    assert groups(m, 2) == ([[0, 1], [2, 3], [4, 5], [6, 7]], "NV18")
    assert groups(m, 4) == ([[0, 1, 2, 3], [4, 5, 6, 7]], "NV18")
    # A pod given GPUs 2-5 for one pair-split job: each pair stays on one socket.
    assert groups(m, 2, [2, 3, 4, 5]) == ([[2, 3], [4, 5]], "NV18")
    # An 8-GPU tensor-parallel group must cross sockets; it still gets the NV18 links.
    assert groups(m, 8) == ([list(range(8))], "NV18")


def test_h200_single_gpu() -> None:
    m = parsed("h200_single_gpu.txt")
    # Tab-separated, with an empty cell before "GPU NUMA ID" (N/A) that is only alignment.
    assert m.size == 1 and m.links == [["X"]]
    assert m.cpu_affinity == ["0-15"] and m.numa_affinity == ["0"]
    # One GPU: one group of one, no peer link at all.
    plan = plan_groups(m, 1)
    assert plan.to_json() == {"groups": [[0]], "worst_link": "X", "score": 0.0}
    # Straight from nvidia-smi on an H200 machine (captured into a pipe): the header is underlined.
    live = (
        "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\nGPU0\t X \t0-15\t0\t\tN/A\n\n"
        "Legend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n"
    )
    assert parse_nvidia_smi_topo(live) == m
    with pytest.raises(TopologyError, match="cannot split 1 GPUs into groups of 2"):
        plan_groups(m, 2)


def test_pcie_2gpu_phb_workstation() -> None:
    m = parsed("pcie_2gpu_5090_phb_workstation.txt")
    assert m.size == 2 and m.link(0, 1) == "PHB" and m.link(1, 0) == "PHB"
    assert m.cpu_affinity == ["0-63", "0-63"] and [m.numa_node(g) for g in (0, 1)] == [0, 0]
    # Only one way to pair two GPUs; their only path goes through the CPU host bridge.
    plan = plan_groups(m, 2)
    assert (plan.groups, plan.worst_link, plan.score) == ([[0, 1]], "PHB", link_score("PHB"))


def test_pcie_4gpu_all_sys() -> None:
    m = parsed("pcie_4gpu_rtx8000_all_sys.txt")
    # The NIC is named by device (mlx5_0), not NICn; its column and row are ignored.
    assert m.size == 4 and m.names == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert all(m.link(a, b) == "SYS" for a in range(4) for b in range(4) if a != b)
    # "NUMA Affinity 0-1": every GPU is attributed to both nodes, so there is no NUMA constraint.
    assert m.numa_affinity == ["0-1"] * 4 and m.numa_node(0) is None
    # All pairs are SYS and NUMA is unknown: every grouping ties, lowest indices win.
    assert groups(m, 2) == ([[0, 1], [2, 3]], "SYS")
    assert groups(m, 4) == ([[0, 1, 2, 3]], "SYS")


def test_pcie_8gpu_plx() -> None:
    m = parsed("pcie_8gpu_plx_pix_pxb_sys.txt")
    # Header row starts at column 0 (no leading blank), NUMA Affinity is N/A everywhere.
    assert m.size == 8 and m.numa_affinity == [None] * 8 and m.cpu_affinity == ["0-95"] * 8
    assert m.link(0, 1) == "PIX" and m.link(0, 2) == "PXB" and m.link(2, 3) == "PXB"
    assert m.link(3, 4) == "SYS" and m.link(4, 5) == "PIX" and m.link(6, 7) == "PXB"
    # Two PCIe switch trees {0-3} and {4-7}, SYS between them. Pairs: GPU0-GPU1 and GPU4-GPU5 share a
    # switch (PIX); GPU2 and GPU3 reach everything in their tree only through PXB, so the worst link
    # is PXB whatever we do -- and [0,1],[2,3] beats [0,2],[1,3] on the sum (PIX+PXB > PXB+PXB).
    plan = plan_groups(m, 2)
    assert (plan.groups, plan.worst_link) == ([[0, 1], [2, 3], [4, 5], [6, 7]], "PXB")
    assert plan.score == 2 * (link_score("PIX") + link_score("PXB"))
    # Groups of four: each switch tree is one group (worst PXB); any mix would include SYS.
    assert groups(m, 4) == ([[0, 1, 2, 3], [4, 5, 6, 7]], "PXB")
    # A subset: 0,1,4,5 are two PIX pairs; 0,2,4,6 can only make PXB pairs, never crossing trees.
    assert groups(m, 2, [0, 1, 4, 5]) == ([[0, 1], [4, 5]], "PIX")
    assert groups(m, 2, [0, 2, 4, 6]) == ([[0, 2], [4, 6]], "PXB")
    assert nccl_p2p_level(plan.worst_link) == "PXB"


def test_heuristic_matches_exact_on_captures(monkeypatch: pytest.MonkeyPatch) -> None:
    m = parsed("pcie_8gpu_plx_pix_pxb_sys.txt")
    d = parsed("dgx_h100_nvswitch_nv18.txt")
    exact = [plan_groups(x, k).to_json() for x in (m, d) for k in (2, 4)]
    monkeypatch.setattr(plan_module, "EXACT_MAX_GPUS", 0)
    assert [plan_groups(x, k).to_json() for x in (m, d) for k in (2, 4)] == exact


# --- parser robustness ---------------------------------------------------------------------------


def test_tabs_spaces_ansi_and_crlf_parse_alike() -> None:
    text = capture("pcie_2gpu_5090_phb_workstation.txt").read_text()
    assert "\t" in text
    base = parse_nvidia_smi_topo(text)
    assert parse_nvidia_smi_topo(text.expandtabs(8)) == base
    assert parse_nvidia_smi_topo(text.replace("\n", "\r\n")) == base
    # nvidia-smi (R5xx drivers) underlines the header, ANSI codes included, even into a pipe:
    # "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m" on an H200 machine.
    header = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    assert header in text
    underlined = text.replace(header, "\t\x1b[4m" + header[1:] + "\x1b[0m")
    assert parse_nvidia_smi_topo(underlined) == base


def test_header_without_affinity_columns_and_nv_links() -> None:
    m = parse_nvidia_smi_topo("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV4\tSYS\nGPU1\tNV4\t X \tSYS\nGPU2\tSYS\tSYS\t X \n")
    assert m.link(0, 1) == "NV4" and m.cpu_affinity == [None] * 3 and m.numa_affinity == [None] * 3


RTX = """\
        GPU0    GPU1    GPU2    GPU3    mlx5_0  CPU Affinity    NUMA Affinity
GPU0     X      SYS     SYS     SYS     SYS     0-7     0-1
GPU1    SYS      X      SYS     SYS     SYS     0-7     0-1
GPU2    SYS     SYS      X      SYS     SYS     0-7     0-1
GPU3    SYS     SYS     SYS      X      SYS     0-7     0-1
mlx5_0  SYS     SYS     SYS     SYS      X
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no GPU header row found"),
        ("Legend:\n\n  X    = Self\n", "no GPU header row found"),
        # the header line lost: the first GPU line holds link levels, so it is a row, not a header
        (RTX.split("\n", 1)[1], "no GPU header row found"),
        # cut after the header
        (RTX.split("\n")[0] + "\n", "no row for GPU0, GPU1, GPU2, GPU3 (input truncated?)"),
        # cut in the middle of GPU3's row
        (RTX[: RTX.index("\nGPU3") + 21], "row GPU3 has 2 link cells, expected 5"),
        # cut after GPU1's row
        ("\n".join(RTX.splitlines()[:3]), "no row for GPU2, GPU3 (input truncated?)"),
        (RTX.replace("GPU1    SYS      X      SYS", "GPU1    SYS      X      FOO"),
         "row GPU1 has unknown link level 'FOO' in column GPU2"),
        (RTX.replace("0-7     0-1\nGPU2", "0-7\nGPU2"),
         "row GPU1 has 1 affinity cells, expected 2 (CPU Affinity, NUMA Affinity)"),
        (RTX.replace("GPU1    SYS      X ", "GPU1    SYS     PIX"), "row GPU1 has 'PIX' in its own column"),
        (RTX.replace("GPU0     X      SYS", "GPU0     X      PIX"),
         "asymmetric links: GPU0-GPU1 is PIX but GPU1-GPU0 is SYS"),
        (RTX.replace("GPU0     X      SYS ", "GPU0     X       X  "), "row GPU0 has 'X' in column GPU1"),
        (RTX.replace("GPU3    SYS", "GPU2    SYS"), "duplicate row GPU2"),
        (RTX.replace("GPU3    SYS", "GPU9    SYS"), "row GPU9 has no column in the header"),
        (RTX.replace("NUMA Affinity", "NUMA Affinity   Fancy"), "unrecognised header column 'Fancy'"),
    ],
)
def test_malformed_input(text: str, message: str) -> None:
    with pytest.raises(TopologyError) as info:
        parse_nvidia_smi_topo(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


# --- link ranking ---------------------------------------------------------------------------------


def test_link_ranking() -> None:
    assert LINK_ORDER == ["NV", "PIX", "PXB", "PHB", "NODE", "SYS"]
    assert [link_class(x) for x in ("NV18", "NV4", "nv1", "PIX", "NODE", "SOC", "X")] == [
        "NV", "NV", "NV", "PIX", "NODE", "SYS", "X",
    ]
    ranked = ["NV18", "NV4", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"]
    scores = [link_score(x) for x in ranked]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)
    assert link_score("X") > link_score("NV18")
    assert meets("NV4", "NV") and meets("NV18", "NV8") and not meets("NV4", "NV8")
    assert meets("PIX", "PXB") and meets("PXB", "PXB") and not meets("PHB", "PXB") and not meets("PIX", "NV")
    with pytest.raises(TopologyError, match="unknown link level 'QPI'"):
        link_score("QPI")


def test_id_lists() -> None:
    assert format_id_list([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8"
    assert parse_id_list("0-2,5,7-8") == {0, 1, 2, 5, 7, 8} and parse_id_list("N/A") is None
    with pytest.raises(TopologyError, match="bad id list 'a-b'"):
        parse_id_list("a-b")


def test_nccl_p2p_level() -> None:
    expected = {"X": "LOC", "NV18": "NVL", "PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "PHB", "SYS": "SYS"}
    assert {k: nccl_p2p_level(k) for k in expected} == expected


# --- planning ------------------------------------------------------------------------------------


def test_numa_rule_on_all_sys_matrix() -> None:
    # Every link is SYS, so links cannot choose; GPUs 0,2 sit on NUMA node 0 and 1,3 on node 1.
    # Index order alone would give [0,1],[2,3] -- both groups split across nodes.
    m = synthetic(uniform(4, "SYS"), numa=["0", "1", "0", "1"])
    plan = plan_groups(m, 2)
    assert (plan.groups, plan.worst_link) == ([[0, 2], [1, 3]], "SYS")
    # Unknown NUMA places no constraint: back to index order.
    assert groups(synthetic(uniform(4, "SYS")), 2) == ([[0, 1], [2, 3]], "SYS")
    # When a split is unavoidable (2 GPUs per node, groups of 4) it is allowed.
    assert groups(m, 4) == ([[0, 1, 2, 3]], "SYS")


def test_worst_link_then_nvlink_count() -> None:
    # 0-2 and 1-3 are NV18, every other pair NV4: [0,2],[1,3] is the only NV18-only pairing.
    links = uniform(4, "NV4")
    links[0][2] = links[2][0] = links[1][3] = links[3][1] = "NV18"
    assert groups(synthetic(links), 2) == ([[0, 2], [1, 3]], "NV18")
    # Only 0-2 is NV18: every pairing has an NV4 worst link, and the sum picks the one holding
    # the NV18 pair over index order ([0,1],[2,3]).
    links[1][3] = links[3][1] = "NV4"
    plan = plan_groups(synthetic(links), 2)
    assert (plan.groups, plan.worst_link, plan.score) == ([[0, 2], [1, 3]], "NV4",
                                                          link_score("NV18") + link_score("NV4"))


def hierarchy(n: int, perm: list[int]) -> LinkMatrix:
    """PIX pairs, PXB quads, NODE octets, SYS halves over GPUs ``perm[0..n)`` (position p -> GPU perm[p])."""
    pos = {g: p for p, g in enumerate(perm)}

    def level(a: int, b: int) -> str:
        pa, pb = pos[a], pos[b]
        if pa == pb:
            return "X"
        for width, name in ((2, "PIX"), (4, "PXB"), (8, "NODE")):
            if pa // width == pb // width:
                return name
        return "SYS"

    numa = [str(pos[g] // (n // 2)) for g in range(n)]
    return synthetic([[level(a, b) for b in range(n)] for a in range(n)], numa)


def test_heuristic_above_eight_gpus() -> None:
    # 16 GPUs: not exact (greedy + swaps), but on a clean switch hierarchy it must find the tiers.
    m = hierarchy(16, list(range(16)))
    assert groups(m, 2) == ([[i, i + 1] for i in range(0, 16, 2)], "PIX")
    assert groups(m, 4) == ([list(range(i, i + 4)) for i in range(0, 16, 4)], "PXB")
    assert groups(m, 8) == ([list(range(8)), list(range(8, 16))], "NODE")
    # The same hierarchy with GPU numbers shuffled: greedy seeds by lowest index, swaps repair.
    perm = [5, 12, 0, 9, 14, 3, 7, 10, 1, 15, 8, 2, 11, 4, 13, 6]
    shuffled = hierarchy(16, perm)
    plan = plan_groups(shuffled, 4)
    assert plan.worst_link == "PXB"
    assert plan.groups == sorted(sorted(perm[i : i + 4]) for i in range(0, 16, 4))


def test_local_search_repairs_greedy() -> None:
    # 10 GPUs. GPU0's best partner is GPU1 (PIX), so greedy pairs [0,1] and leaves [2,3] joined by
    # SYS. Swapping 1 and 3 gives [0,3],[1,2], both PXB: a better worst link, found by the swaps.
    links = uniform(10, "SYS")
    for a, b, level in ((0, 1, "PIX"), (0, 3, "PXB"), (1, 2, "PXB"), (4, 5, "PIX"), (6, 7, "PIX"), (8, 9, "PIX")):
        links[a][b] = links[b][a] = level
    m = synthetic(links)
    assert plan_module._greedy(list(range(10)), 2, plan_module._Scorer(m))[:2] == [(0, 1), (2, 3)]
    assert groups(m, 2) == ([[0, 3], [1, 2], [4, 5], [6, 7], [8, 9]], "PXB")


def test_plan_errors() -> None:
    m = synthetic(uniform(8, "PIX"))
    with pytest.raises(TopologyError, match="cannot split 8 GPUs into groups of 3: 3 does not divide 8"):
        plan_groups(m, 3)
    with pytest.raises(TopologyError, match="cannot split 3 GPUs into groups of 2"):
        plan_groups(m, 2, [0, 1, 2])
    with pytest.raises(TopologyError, match="GPU 9 is not in the topology"):
        plan_groups(m, 2, [0, 9])
    with pytest.raises(TopologyError, match="GPU 1 is listed twice"):
        plan_groups(m, 2, [1, 1])
    with pytest.raises(TopologyError, match="group size must be at least 1, got 0"):
        plan_groups(m, 0)
    with pytest.raises(TopologyError, match="no GPUs to plan"):
        plan_groups(m, 1, [])


def test_plan_json_and_pinning() -> None:
    plan = Plan(groups=[[0, 1], [2, 3]], worst_link="PIX", score=10.0)
    assert plan.to_json() == {"groups": [[0, 1], [2, 3]], "worst_link": "PIX", "score": 10.0}
    assert [pin_devices(plan, r) for r in range(4)] == [([0, 1], 0), ([0, 1], 1), ([2, 3], 2), ([2, 3], 3)]
    with pytest.raises(TopologyError, match="local rank 4 is out of range: the plan has 4 GPUs"):
        pin_devices(plan, 4)


# --- NVML and local reading ----------------------------------------------------------------------


def fake_pynvml() -> types.ModuleType:
    """Four GPUs: 0-1 joined by 2 direct NVLinks, 2 and 3 each with 6 links to NVSwitches."""
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    bus = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:9A:00.0", "00000000:AB:00.0"]
    ancestor = {(0, 1): 10, (0, 2): 50, (0, 3): 50, (1, 2): 50, (1, 3): 50, (2, 3): 20}
    links = {0: ["0000:2a:00.0"] * 2, 1: ["0000:18:00.0"] * 2, 2: ["00000000:05:00.0"] * 6, 3: ["00000000:06:00.0"] * 6}

    def link_of(h: int, link: int) -> str:
        if link >= len(links[h]):
            raise NVMLError("Not Supported")
        return links[h][link]

    nv.NVMLError = NVMLError
    nv.NVML_FEATURE_ENABLED = 1
    nv.NVML_NVLINK_MAX_LINKS = 18
    nv.nvmlInit = nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 4
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus[h].encode())
    nv.nvmlDeviceGetNvLinkState = lambda h, link: 1 if link_of(h, link) else 0
    nv.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(busId=link_of(h, link))
    nv.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, link: 2
    nv.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: ancestor[(min(a, b), max(a, b))]
    nv.nvmlDeviceGetCpuAffinity = lambda h, words: [0xFF if h < 2 else 0xFF00] + [0] * (words - 1)
    nv.nvmlDeviceGetMemoryAffinity = lambda h, words, scope: [1 if h < 2 else 2] + [0] * (words - 1)
    return nv


def test_read_nvml_with_fake_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    m = read_nvml()
    assert m.links == [
        ["X", "NV2", "SYS", "SYS"],
        ["NV2", "X", "SYS", "SYS"],
        ["SYS", "SYS", "X", "NV6"],
        ["SYS", "SYS", "NV6", "X"],
    ]
    assert m.cpu_affinity == ["0-7", "0-7", "8-15", "8-15"] and m.numa_affinity == ["0", "0", "1", "1"]
    assert groups(m, 2) == ([[0, 1], [2, 3]], "NV2")
    assert m.source == "nvml"


def test_read_nvml_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(TopologyError, match="pynvml is not installed"):
        read_nvml()


def test_read_local_falls_back_to_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(TopologyError, match="no NVIDIA GPU found: neither NVML nor nvidia-smi is available"):
        read_local()
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '{RTX}'\n")
    smi.chmod(0o755)
    assert read_local().size == 4 and read_local().source == "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\n"
                   "exit 9\n")
    with pytest.raises(TopologyError, match="nvidia-smi topo -m exited 9: NVIDIA-SMI has failed"):
        read_local()


# --- CLI -----------------------------------------------------------------------------------------


def cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    # A pynvml that fails to import and a PATH without nvidia-smi: "the local machine" has no GPU.
    (tmp_path / "pynvml.py").write_text("raise ImportError('blocked by the test')\n")
    env = {"PATH": str(tmp_path), "PYTHONPATH": f"{tmp_path}:{REPO / 'runtime'}"}
    return subprocess.run(
        [sys.executable, "-m", "kuberl.topology.cli", "topology", *args],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=60,
    )


def assert_one_error_line(done: subprocess.CompletedProcess[str], text: str) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0]


def test_cli_plan(tmp_path: Path) -> None:
    topo = capture("pcie_8gpu_plx_pix_pxb_sys.txt")
    done = cli("plan", "--topo", str(topo), "--group-size", "2", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out) == {"groups", "worst_link", "score"}
    assert out["groups"] == [[0, 1], [2, 3], [4, 5], [6, 7]] and out["worst_link"] == "PXB"
    assert isinstance(out["score"], (int, float))
    done = cli("plan", "--topo", str(topo), "--group-size", "2", "--gpus", "0,1,4,5", tmp_path=tmp_path)
    assert json.loads(done.stdout)["groups"] == [[0, 1], [4, 5]]


def test_cli_errors(tmp_path: Path) -> None:
    text = capture("pcie_8gpu_plx_pix_pxb_sys.txt").read_text()
    truncated = tmp_path / "truncated.txt"
    truncated.write_text(text[: text.index("\nGPU5") + 31])
    done = cli("plan", "--topo", str(truncated), "--group-size", "2", tmp_path=tmp_path)
    assert_one_error_line(done, "row GPU5 has")
    done = cli("plan", "--topo", str(tmp_path / "missing.txt"), "--group-size", "2", tmp_path=tmp_path)
    assert_one_error_line(done, "No such file or directory")
    topo = capture("pcie_8gpu_plx_pix_pxb_sys.txt")
    done = cli("plan", "--topo", str(topo), "--group-size", "3", tmp_path=tmp_path)
    assert_one_error_line(done, "cannot split 8 GPUs into groups of 3")


def test_cli_show(tmp_path: Path) -> None:
    done = cli("show", "--topo", str(capture("dgx_h100_nvswitch_nv18.txt")), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 9 and lines[0].split()[:2] == ["GPU0", "GPU1"] and "NUMA Affinity" in lines[0]
    assert lines[1].split() == ["GPU0", "X", *["NV18"] * 7, "0-55,112-167", "0"]
    done = cli("show", tmp_path=tmp_path)
    assert_one_error_line(done, "no NVIDIA GPU found: neither NVML nor nvidia-smi is available")

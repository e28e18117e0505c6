"""Placement layer 3: ranks pinned to topology-planned GPU groups; minLink enforcement; visibility."""

from __future__ import annotations

import json
import sys

import pytest

from kuberl.metrics import prom_samples
from kuberl.metrics.progress import progress_of
from kuberl.metrics.record import RoleStep, StepRecord
from kuberl.spec import validate_manifest
from kuberl.topology import parse_nvidia_smi_topo
from kuberl.topology.placement import RankPlacement, group_size, pin_rank, place_ranks, placement_problem
from kuberl.workers.groups import local_ranks


def spec(**extra):
    base = {"data": {"task": "repeat-letter"}, "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
            "roles": {"actor": {"gpus": 4}}, "trainer": {"microBatchSize": 4}}
    base.update(extra)
    manifest = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "p"}, "spec": base}
    return validate_manifest(manifest).spec


@pytest.fixture
def topo(shared_dir):
    return lambda name: parse_nvidia_smi_topo((shared_dir / "fixtures" / "topo" / name).read_text())


def test_local_ranks_group_by_node():
    nodes = [("n1", [3]), ("n2", [0]), ("n1", [1]), ("n1", [0])]
    # rank 0,2,3 share n1 and hold GPUs {0,1,3}; rank 1 is alone on n2
    assert local_ranks(nodes) == [(0, [0, 1, 3]), (0, [0]), (1, [0, 1, 3]), (2, [0, 1, 3])]


def test_dgx_pairs_are_nvlinked(topo):
    # every GPU pair of the DGX H100 capture is NV18 (NVSwitch): groups of 2 keep NV18, NCCL may use NVLink
    places = place_ranks(topo("dgx_h100_nvswitch_nv18.txt"), list(range(8)), 2)
    assert [p.device for p in places] == list(range(8))
    assert places[0].group == (0, 1) and places[7].group == (6, 7)
    assert {p.worst_link for p in places} == {"NV18"} and places[0].nccl_p2p_level == "NVL"


def test_plx_box_pins_ranks_to_pix_pairs_and_reports_sys_when_forced(topo):
    m = topo("pcie_8gpu_plx_pix_pxb_sys.txt")
    # all 8 GPUs: pairs behind the same PLX switch; GPU2/GPU3 only reach others over PXB, so PXB is the worst
    places = place_ranks(m, list(range(8)), 2)
    assert [p.group for p in places[::2]] == [(0, 1), (2, 3), (4, 5), (6, 7)] and places[0].worst_link == "PXB"
    # Ray reserved GPUs 1 and 5 (different CPU sockets): the only pair is SYS
    forced = place_ranks(m, [5, 1], 2)
    assert [p.device for p in forced] == [1, 5] and forced[0].worst_link == "SYS" and forced[0].nccl_p2p_level == "SYS"


def test_required_min_link_names_the_field():
    s = spec(placement={"policy": "required", "minLink": "PIX"})
    msg = placement_problem(s, "actor", "SYS")
    assert msg.startswith("role actor: worst GPU link SYS (SYS)")
    assert "spec.placement.minLink PIX" in msg and "fix:" in msg
    assert placement_problem(s, "actor", "NV4") is None and placement_problem(s, "actor", "PIX") is None
    assert placement_problem(s, "actor", "unknown") is not None  # unknown never passes `required`
    assert placement_problem(spec(placement={"minLink": "PIX"}), "actor", "SYS") is None  # preferred: report only


def test_group_size_follows_tensor_parallel_for_actor():
    assert group_size(spec(rollout={"tensorParallelSize": 2}), "actor") == 2
    assert group_size(spec(), "actor") == 4 and group_size(spec(), "ref") == 1


def test_pin_rank_without_topology_falls_back_in_index_order(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi; NVML finds no driver library here
    p = pin_rank(spec(), "actor", 1, [6, 2])
    assert p == RankPlacement(6, (2, 6), "unknown", "SYS", "none")
    assert "kuberl: actor rank 1: GPU topology from nowhere (no NVIDIA GPU found" in capsys.readouterr().err


def test_pin_rank_says_where_the_topology_came_from(monkeypatch, tmp_path, capsys, shared_dir):
    """NVML when its driver answers (here the test's stand-in pynvml module), else nvidia-smi's text."""
    from tests.unit.test_topology import fake_pynvml

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    p = pin_rank(spec(roles={"actor": {"gpus": 2}}, trainer={"microBatchSize": 8}), "actor", 1, [0, 1, 2, 3])
    assert (p.topology_source, p.worst_link) == ("nvml", "NV2")
    assert "kuberl: actor rank 1: GPU topology from NVML; GPU 1, worst link NV2" in capsys.readouterr().err

    monkeypatch.setitem(sys.modules, "pynvml", None)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat {shared_dir / 'fixtures' / 'topo' / 'dgx_h100_nvswitch_nv18.txt'}\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")  # ours first; cat from the system
    p = pin_rank(spec(), "actor", 0, list(range(8)))
    assert (p.topology_source, p.worst_link) == ("nvidia-smi", "NV18")
    assert "GPU topology from nvidia-smi topo -m (NVML unavailable)" in capsys.readouterr().err


def test_worst_link_is_visible_in_metrics_and_progress():
    rec = StepRecord(step=3, roles={"actor": RoleStep(restarts=0, worst_link="PXB", topology_source="nvml")})
    samples = prom_samples(rec)
    assert ("kuberl_role_worst_link_score", {"role": "actor", "level": "PXB", "source": "nvml"}, 4.0) in samples
    doc = json.loads(progress_of(rec, 10, "Failed", "below minLink", "PlacementDegraded", {"critic": "SYS"}).to_json())
    assert doc["roles"] == {"actor": {"restarts": 0, "worstLink": "PXB"}, "critic": {"worstLink": "SYS"}}
    assert doc["reason"] == "PlacementDegraded"


def test_dra_mode_needs_gpus():
    with pytest.raises(Exception) as info:
        spec(roles={"actor": {"gpus": 0}}, placement={"mode": "dra"})
    assert "spec.placement.mode" in str(info.value)

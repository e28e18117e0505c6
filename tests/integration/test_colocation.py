"""Colocation on CPU with real Ray: ref and critic share the actor's (fake) GPU, each its own process.

The session's Ray advertises 2 GPUs that do not exist; the roles ask for 1 GPU per replica and run on
device cpu, so the placement and the fractional requests are Ray's real ones while the workers compute
on the CPU."""

from __future__ import annotations

import pytest

from kuberl.colocation import SharedPlacement
from kuberl.driver import Driver, Fault
from kuberl.groups import RayWorkerGroup
from kuberl.metrics import read_jsonl
from kuberl.workers import Worker

from .conftest import load_example

SHARED = ("actor", "critic", "ref")


def colocated_spec(steps: int = 4):
    gpu = {"replicas": 1, "gpus": 1}
    return load_example("quickstart.yaml", **{
        "trainer.steps": steps, "trainer.checkpoint.interval": 2,
        "roles.actor": {**gpu, "resources": {"cpu": "1", "memory": "2Gi"}},
        "roles.critic": {**gpu, "colocateWith": "actor", "resources": {"cpu": "500m", "memory": "2Gi"}},
        "roles.ref": {**gpu, "colocateWith": "actor", "resources": {"cpu": "250m", "memory": "1Gi"}},
    }).spec


def placement(driver: Driver, role: str) -> dict:
    """What Ray reserved for the role's one rank: its node, placement group, resources and GPU ids."""
    (info,) = driver.groups[role].call(Worker.placement_info)
    return info["ray"]


def test_killed_colocated_ref_recovers_alone_on_the_actors_gpu(ray_session, tmp_path):
    spec = colocated_spec()
    shared = SharedPlacement(spec)
    driver = Driver(spec, "colocated", tmp_path, lambda r: RayWorkerGroup(r, spec, "cpu", timeout_s=120, shared=shared),
                    faults=[Fault("ref", 2)], progress=False)
    driver.start()
    try:
        before = {r: [(i["pid"], i["actor_id"]) for i in g.identities()] for r, g in driver.groups.items()}
        placed = {r: placement(driver, r) for r in SHARED}
        records = driver.run()
        after = {r: [(i["pid"], i["actor_id"]) for i in g.identities()] for r, g in driver.groups.items()}
        placed_after = placement(driver, "ref")
    finally:
        driver.shutdown()
    # ranks of the three roles: one node, one placement group (the set's), the same GPU, 1/3 of it each
    assert len({p["node"] for p in placed.values()}) == 1
    assert len({p["placement_group"] for p in placed.values()}) == 1
    assert len({tuple(p["gpu_ids"]) for p in placed.values()}) == 1 and placed["actor"]["gpu_ids"]
    for role, p in placed.items():
        assert p["resources"]["GPU"] == pytest.approx(1 / 3, abs=1e-3), (role, p["resources"])
        assert p["resources"][f"kuberl_role_{role}"] == 1.0
    # the ref died and came back alone, into the same placement group and GPU; nothing else moved
    assert after["ref"] != before["ref"] and after["ref"][0][0] != before["ref"][0][0]
    for role in ("actor", "critic", "reward"):
        assert after[role] == before[role], f"{role} was disturbed by the colocated ref's failure"
        assert driver.history[role].recoveries == []
    (rec,) = driver.history["ref"].recoveries
    assert rec.step == 2 and "died" in rec.detail and rec.restored_from == "model path"
    assert placed_after["placement_group"] == placed["actor"]["placement_group"]
    assert placed_after["gpu_ids"] == placed["actor"]["gpu_ids"]
    assert placed_after["resources"]["GPU"] == pytest.approx(1 / 3, abs=1e-3)
    # training went on: every step recorded, the ref's restart counted
    assert driver.step == 4 and [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
    assert records[-1].flat()["restarts_ref"] == 1 and records[-1].flat()["restarts_actor"] == 0
    assert shared.groups == {}  # the set's placement group went with the last of its roles


def test_a_colocated_group_needs_the_shared_placement(ray_session):
    spec = colocated_spec()
    with pytest.raises(ValueError, match="give every RayWorkerGroup of the job one SharedPlacement"):
        RayWorkerGroup("ref", spec, "cpu")
    assert RayWorkerGroup("reward", spec, "cpu").bundle() == {"CPU": 0.25, "kuberl_role_reward": 1.0}

"""Colocation on CPU with real Ray: ref and critic share the actor's (fake) GPU, each its own process.

The session's Ray advertises 2 GPUs that do not exist; the roles ask for 1 GPU per replica and run on
device cpu, so the placement and the fractional requests are Ray's real ones while the workers compute
on the CPU."""

from __future__ import annotations

import pytest

from kuberl.controller.driver import Driver, Fault
from kuberl.metrics import read_jsonl
from kuberl.spec.colocation import SharedPlacement
from kuberl.workers import Worker
from kuberl.workers.groups import LocalWorkerGroup, RayWorkerGroup

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


def run_killing(role: str, tmp_path, steps: int = 4):
    """The colocated job on Ray with `role`'s process killed at step 2: (driver, records, (pid, actor id) of each
    role's ranks before and after, each sharing role's placement before, `role`'s placement after)."""
    spec = colocated_spec(steps)
    shared = SharedPlacement(spec)
    driver = Driver(spec, "colocated", tmp_path, lambda r: RayWorkerGroup(r, spec, "cpu", timeout_s=120, shared=shared),
                    faults=[Fault(role, 2)], progress=False)
    driver.start()
    try:
        before = {r: [(i["pid"], i["actor_id"]) for i in g.identities()] for r, g in driver.groups.items()}
        placed = {r: placement(driver, r) for r in SHARED}
        records = driver.run()
        after = {r: [(i["pid"], i["actor_id"]) for i in g.identities()] for r, g in driver.groups.items()}
        placed_after = placement(driver, role)
    finally:
        driver.shutdown()
    return driver, records, before, after, placed, placed_after


def test_killed_colocated_ref_recovers_alone_on_the_actors_gpu(ray_session, tmp_path):
    driver, records, before, after, placed, placed_after = run_killing("ref", tmp_path)
    shared = driver.groups["ref"].shared
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
    # the three roles' phases ran one after another (ref, values; update_critic, update_actor), never at once
    for rec in records:
        spans = [s for s in rec.timeline if s.role in SHARED]
        assert {s.phase for s in spans} >= {"ref", "values", "update_critic", "update_actor"}
        clashes = [(a.phase, b.phase) for i, a in enumerate(spans) for b in spans[i + 1:]
                   if a.role != b.role and a.overlaps(b)]
        assert clashes == [], (rec.step, clashes)


def test_a_colocated_group_needs_the_shared_placement(ray_session):
    spec = colocated_spec()
    with pytest.raises(ValueError, match="give every RayWorkerGroup of the job one SharedPlacement"):
        RayWorkerGroup("ref", spec, "cpu")
    assert RayWorkerGroup("reward", spec, "cpu").bundle() == {"CPU": 0.25, "kuberl_role_reward": 1.0}


TRAINED = ("reward_mean", "kl", "pg_loss", "vf_loss", "entropy", "actor_grad_norm", "critic_grad_norm")


def local_run(tmp_path, colocated: bool, idle: str = "offload") -> tuple[list[dict], dict]:
    """3 steps in-process (`--backend local`): every role's worker in this process, on the CPU."""
    shared = {"colocateWith": "actor", "idleMemory": idle} if colocated else {}
    spec = load_example("quickstart.yaml", **{
        "trainer.steps": 3, "trainer.ppoEpochs": 1, "trainer.miniBatchSize": 8, "trainer.microBatchSize": 4,
        "data.batchSize": 16, "roles.ref": {"replicas": 1, **shared}, "roles.critic": {"replicas": 1, **shared},
        "roles.actor.idleMemory": idle}).spec
    out = tmp_path / ("colocated" if colocated else "apart")
    driver = Driver(spec, "local", out, lambda r: LocalWorkerGroup(r, spec, "cpu"), progress=False)
    driver.start()
    try:
        driver.run()
        residents = {r: g.worker.resident for r, g in driver.groups.items()}
    finally:
        driver.shutdown()
    return read_jsonl(out / "metrics.jsonl"), residents


@pytest.fixture(scope="module")
def apart(netns, tmp_path_factory) -> list[dict]:
    metrics, residents = local_run(tmp_path_factory.mktemp("apart"), colocated=False)
    assert set(residents.values()) == {None}  # no role shares its GPUs: no memory policy
    return metrics


@pytest.mark.parametrize("idle", ["offload", "free"])
def test_in_process_colocation_trains_like_apart(apart, tmp_path, idle):
    """The memory policy runs between every phase (on the CPU its moves stay in host memory) and the job
    computes the same steps, bit for bit, as with each role on its own."""
    together, residents = local_run(tmp_path, colocated=True, idle=idle)
    assert residents["reward"] is None and all(residents[r].offload == (idle == "offload") for r in SHARED)
    assert all(residents[r].asleep == (idle == "offload") for r in SHARED)  # asleep between phases
    assert len(residents["actor"].modules) == 2  # the policy and the hf engine's model
    assert [r["step"] for r in together] == [1, 2, 3]
    for a, b in zip(apart, together):
        assert {k: b[k] for k in TRAINED} == {k: a[k] for k in TRAINED}, a["step"]

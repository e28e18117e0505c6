"""Warm standbys, hang diagnosis and deterministic errors, on CPU with real Ray (spec.resilience.standby).

A standby is a second set of a role's ranks, started and set up before it is needed: on a failure it
takes over (its processes, set up in advance, become the role), and a new standby starts behind it."""

from __future__ import annotations

import pytest

from kuberl.controller.driver import Driver, Fault
from kuberl.metrics import read_jsonl
from kuberl.resilience.standby import StandbyGroup
from kuberl.workers.groups import RayWorkerGroup, RoleError

from .conftest import load_example
from .probes import PROBED, CollectiveErrorReward, Probes


def spec_for(**overrides):
    base = {"trainer.steps": 5, "trainer.checkpoint.interval": 2, "resilience.standby": True}
    base.update(overrides)
    return load_example("quickstart.yaml", **base).spec


def pids(group) -> list[int]:
    return [i["pid"] for i in group.identities()]


@pytest.mark.parametrize("role", ["critic", "reward"])
def test_standby_takes_over_and_a_new_one_starts(ray_session, tmp_path, role):
    spec = spec_for()
    seen: dict[str, list[int]] = {}

    def on_step(rec):
        driver.roles.commit()  # the step's snapshot copies, running beside the next step, are whole before its kill
        if rec.step == 2:  # before the fault at step 3: the role's processes and its standby's
            group = driver.groups[role]
            seen["active"], seen["standby"] = pids(group), pids(group.standby.wait())

    driver = Driver(spec, f"standby-{role}", tmp_path, lambda r: RayWorkerGroup(r, spec, timeout_s=120),
                    faults=[Fault(role, 3)], progress=False, on_step=on_step)
    driver.start()
    try:
        assert all(isinstance(g, StandbyGroup) for g in driver.groups.values())
        records = driver.run()
        group = driver.groups[role]
        after, next_standby = pids(group), pids(group.standby.wait())
        standby_ready = group.standby_ready()
    finally:
        driver.shutdown()
    (rec,) = driver.history[role].recoveries
    assert rec.standby is True and rec.step == 3 and "died" in rec.detail
    assert after == seen["standby"]  # the processes started in advance took over
    assert not set(next_standby) & (set(after) | set(seen["active"]))  # and a fresh standby stands behind them
    assert standby_ready is True and group.takeovers == 1
    # the critic (CPU) comes back from its per-step snapshot of the last completed step: nothing lost
    assert rec.restored_from == ("snapshot step 2, held by the standby" if role == "critic" else "model path")
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(1, 6))
    assert records[-1].roles[role].last_failure.startswith("WorkerDied at step 3")
    print(f"standby {role}: detect={rec.detect_s:.3f}s ready={rec.ready_s:.3f}s replay={rec.replay_s:.3f}s")


def test_a_trained_role_s_standby_takes_over_with_its_last_completed_step_bit_identical(ray_session, tmp_path):
    """Actor killed in step 3, critic in step 4: each one's standby has already loaded the snapshot of
    the last completed step as it was committed, so the take-over copies nothing, and the role's state
    (every parameter shard and its optimizer state) is byte for byte what it was at the end of that step."""
    spec = spec_for()
    at_end: dict[tuple[str, int], list[str]] = {}
    after: dict[str, dict] = {}

    def on_step(rec):
        # the step's snapshot copies, which run beside the next step, are whole before its kill (on a loaded
        # machine one could still be running: the role would then run its update again, a case of test_faults)
        driver.roles.commit()
        for role in ("actor", "critic"):
            at_end[role, rec.step] = driver.groups[role].call(Probes.state_digest)

    def on_restart(rec):
        group = driver.groups[rec.role]
        after[rec.role] = {"digest": group.call(Probes.state_digest),
                           "rollout_match": group.call(Probes.rollout_weights_match) if rec.role == "actor" else None}

    driver = Driver(spec, "standby-state", tmp_path,
                    lambda r: RayWorkerGroup(r, spec, timeout_s=120, worker_cls=PROBED.get(r)),
                    faults=[Fault("actor", 3), Fault("critic", 4)], progress=False, on_step=on_step)
    driver.roles.on_restart.append(on_restart)
    driver.start()
    try:
        driver.roles.wait_standbys()
        driver.run()
    finally:
        driver.shutdown()
    for role, step in (("actor", 3), ("critic", 4)):
        (rec,) = driver.history[role].recoveries
        assert rec.standby is True and rec.step == step and rec.steps_lost == 0
        assert rec.restored_from == f"snapshot step {step - 1}, held by the standby"
        assert after[role]["digest"] == at_end[role, step - 1]
    assert after["actor"]["rollout_match"] is True  # the engine got the restored weights
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(1, 6))
    assert driver.groups["critic"].follow_results  # its standbys answered the follows (seconds per rank)


def test_hang_is_diagnosed_before_the_worker_is_killed(ray_session, tmp_path, capfd):
    """The hung rank's stacks reach the driver's log and the recovery names role, rank and frame."""
    spec = spec_for(**{"resilience.callTimeoutSeconds": 5, "trainer.steps": 3})
    driver = Driver(spec, "hang-diag", tmp_path, lambda r: RayWorkerGroup(r, spec, timeout_s=5),
                    faults=[Fault("ref", 2, "hang")], progress=False)
    driver.start()
    try:
        records = driver.run()
    finally:
        driver.shutdown()
    (rec,) = driver.history["ref"].recoveries
    assert rec.diagnosis.startswith("role ref rank 0 hung in user code: execute at kuberl/workers/base.py:")
    assert rec.diagnosis in rec.detail and 5 <= rec.detect_s < 15 and rec.standby is True
    log = capfd.readouterr().out
    assert "role ref rank 0 stacks before it is killed:" in log and "(the driver's call)" in log
    assert "time.sleep(3600)" in log
    last = records[-1].roles["ref"].last_failure
    assert last.startswith("WorkerHung at step 2 (ref): role ref rank 0 hung in user code")


def test_a_rank_hung_outside_a_collective_is_named_while_its_peer_times_out_in_one(ray_session, tmp_path):
    """Two critic ranks; the last one hangs in user code while rank 0 waits in FSDP's all-gather. The
    process group's timeout (half callTimeoutSeconds) fails rank 0's collective first; the hung rank
    still answers the ping (control concurrency group), so the role counts as hung, not as a bug."""
    spec = spec_for(**{"roles.critic.replicas": 2, "trainer.microBatchSize": 8, "resilience.standby": False,
                       "resilience.callTimeoutSeconds": 20, "trainer.steps": 3})
    driver = Driver(spec, "collective-hang", tmp_path, lambda r: RayWorkerGroup(r, spec), progress=False,
                    faults=[Fault("critic", 2, "hang")])
    driver.start()
    try:
        driver.run()
    finally:
        driver.shutdown()
    (rec,) = driver.history["critic"].recoveries
    assert rec.reason.value == "WorkerHung" and "a collective failed (RuntimeError:" in rec.detail
    assert "Timed out waiting 10000ms" in rec.detail and rec.detect_s < 20
    assert rec.diagnosis.startswith("role critic rank 1 hung in user code: execute at kuberl/workers/base.py:")
    assert driver.step == 3 and rec.restored_from == "snapshot step 1" and rec.steps_lost == 0


def test_the_same_error_twice_in_a_row_fails_the_job_with_it(ray_session, tmp_path):
    """A torch.distributed error is first taken for a crash (one restart); the same error from the replay
    of the same call is deterministic: the job fails with it, and no further restart is spent."""
    spec = spec_for(**{"roles.reward.maxRestarts": 5, "resilience.standby": False})

    def make(role):
        return RayWorkerGroup(role, spec, timeout_s=120, worker_cls=CollectiveErrorReward if role == "reward" else None)

    driver = Driver(spec, "twice", tmp_path, make, progress=False)
    driver.start()
    try:
        with pytest.raises(RoleError) as info:
            driver.run()
    finally:
        driver.shutdown()
    msg = str(info.value)
    assert msg.startswith("role reward raised DistBackendError: simulated: allreduce failed the same way every time")
    assert "twice in a row at RewardWorker.compute_scores" in msg
    assert driver.history["reward"].restarts == 1

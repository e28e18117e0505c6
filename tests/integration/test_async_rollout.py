"""spec.rollout.async on real Ray: actor, critic and rollout (and ref, reward) each in its own process; the
quickstart learns, no batch lags more than maxStaleness, and a killed rollout worker is restarted alone, losing
only the prompt batches it held, which are counted."""

from __future__ import annotations

import torch

from kuberl.controller.driver import Driver
from kuberl.controller.roles import Fault
from kuberl.metrics import read_jsonl
from kuberl.resilience import checkpoint
from kuberl.run import run_job
from kuberl.workers.groups import RayWorkerGroup

from .conftest import load_example
from .test_runtime import Stop, run_local

ASYNC = {"rollout.async": {"maxStaleness": 2}, "roles.rollout": {"replicas": 1, "resources": {"cpu": "500m"}}}


def test_async_rollout_learns_the_quickstart_in_separate_processes(ray_session, tmp_path):
    job = load_example("quickstart.yaml", **ASYNC)
    run_job(job, tmp_path, backend="ray", progress=False)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, job.spec.trainer.steps + 1))
    assert rows[0]["staleness"] == 0 and all(0 <= r["staleness"] == r["staleness_max"] <= 2 for r in rows)
    assert all(r["samples_dropped_stale"] == r["samples_lost_rollout"] == 0 for r in rows)
    assert "time_old_logprobs_s" in rows[-1] and "time_weight_push_s" in rows[-1] and "restarts_rollout" in rows[-1]
    first, last = sum(r["reward_mean"] for r in rows[:10]) / 10, sum(r["reward_mean"] for r in rows[-10:]) / 10
    print(f"async (maxStaleness 2) quickstart reward first10={first:.3f} last10={last:.3f} gain={last - first:.3f}")
    assert last - first >= 0.2


def test_a_killed_rollout_worker_loses_only_its_in_flight_samples(ray_session, tmp_path):
    """Killed at step 3 (maxStaleness 1): the batch step 3 waited for and the one queued behind it were on that
    worker and are lost (2 x samples per step, counted at step 3); the rollout role alone is restarted, gets the
    actor's weights again and the run goes on, its next batch fresh."""
    spec = load_example("quickstart.yaml", **{**ASYNC, "rollout.async": {"maxStaleness": 1}, "trainer.steps": 6}).spec
    driver = Driver(spec, "kill-rollout", tmp_path, lambda r: RayWorkerGroup(r, spec, timeout_s=120),
                    faults=[Fault("rollout", 3)], progress=False)
    driver.start()
    try:
        pids = {r: [i["pid"] for i in g.identities()] for r, g in driver.groups.items()}
        records = driver.run()
        after = {r: [i["pid"] for i in g.identities()] for r, g in driver.groups.items()}
    finally:
        driver.shutdown()
    assert driver.step == 6
    lost = [r.stats["samples_lost_rollout"] for r in records]
    assert lost == [0, 0, 2 * spec.samples_per_step, 0, 0, 0]
    assert all(r.stats["samples_dropped_stale"] == 0 for r in records)
    assert records[2].staleness == 0  # the batch after the loss: generated with the weights pushed again
    (rec,) = driver.history["rollout"].recoveries
    assert rec.step == 3 and rec.restored_from == "model path"
    assert driver.stream.next_ticket == 6 + 2 and not driver.stream.pending  # one a step, the 2 lost made good
    assert after["rollout"] != pids["rollout"]
    assert all(after[r] == pids[r] and not driver.history[r].recoveries for r in pids if r != "rollout")


def test_async_rollout_in_process_learns_grpo(netns, tmp_path):
    """The in-process path (LocalWorkerGroup, the rollout's thread beside the driver) on the GRPO example."""
    job = load_example("grpo.yaml", **{**ASYNC, "rollout.async": {"maxStaleness": 2, "partial": "continue"}})
    run_local(job.spec, tmp_path)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(rows) == job.spec.trainer.steps and max(r["staleness_max"] for r in rows) <= 2
    first, last = sum(r["reward_mean"] for r in rows[:10]) / 10, sum(r["reward_mean"] for r in rows[-10:]) / 10
    print(f"async (continue) grpo in-process reward first10={first:.3f} last10={last:.3f}")
    assert last - first >= 0.1


class Trained(Driver):
    """Keeps the prompts each step trained on; stops (raises Stop) after step `stop_after`."""

    def __init__(self, *args, stop_after: int | None = None, **kwargs):
        super().__init__(*args, on_step=self._after_step, **kwargs)
        self.trained: dict[int, torch.Tensor] = {}
        self.stop_after = stop_after

    def _rollout(self, phases):
        batch, staleness = super()._rollout(phases)
        self.trained[self.step + 1] = batch["prompt_ids"].clone()
        return batch, staleness

    def _after_step(self, rec) -> None:
        if rec.step == self.stop_after:
            raise Stop


def test_async_resume_draws_the_queued_prompts_again(netns, tmp_path):
    """Stopped after step 3 (step 2's checkpoint committed, later prompts queued at the rollout role) and resumed:
    the checkpoint holds the data position before the oldest queued ticket, so steps 3..6 train on the prompts an
    uninterrupted run trained on, and metrics.jsonl has steps 1..6 once."""
    spec = load_example("quickstart.yaml", **{**ASYNC, "trainer.steps": 6, "trainer.checkpoint.interval": 2}).spec
    whole = run_local(spec, tmp_path / "whole", driver_cls=Trained)
    assert whole.stream.next_ticket == 6 and not whole.stream.pending  # a ticket per step, none past the last
    run_local(spec, tmp_path / "split", Trained, stops=True, stop_after=3)
    assert checkpoint.latest(tmp_path / "split" / "checkpoints") == 2
    resumed = run_local(spec, tmp_path / "split", driver_cls=Trained)
    assert sorted(resumed.trained) == [3, 4, 5, 6]
    for step, prompts in resumed.trained.items():
        assert prompts.equal(whole.trained[step]), f"step {step}: not the prompts the uninterrupted run trained on"
    assert not whole.trained[3].equal(whole.trained[4])
    assert [r["step"] for r in read_jsonl(tmp_path / "split" / "metrics.jsonl")] == list(range(1, 7))

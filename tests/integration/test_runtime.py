"""The runtime end to end on CPU: real Ray actors, real gloo process groups, real FSDP2."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

from kuberl.controller.driver import Driver
from kuberl.controller.proxies import ActorProxy
from kuberl.metrics import read_jsonl
from kuberl.run import run_job
from kuberl.spec import JobSpec
from kuberl.workers.groups import LocalWorkerGroup, RayWorkerGroup

from .conftest import REPO, load_example
from .probes import ProbedActor, Probes

PHASES = ("rollout", "reward", "ref", "values", "advantage", "update_actor", "update_critic", "weight_sync")


def mean(rows, key="reward_mean"):
    return sum(r[key] for r in rows) / len(rows)


def test_quickstart_learns_on_ray(ray_session, tmp_path):
    """The README's demo: reward of the last 10 steps beats the first 10 by >= 0.2, with every metric."""
    job = load_example("quickstart.yaml")
    records = run_job(job, tmp_path, backend="ray", progress=False)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, job.spec.trainer.steps + 1))
    first, last = mean(rows[:10]), mean(rows[-10:])
    print(f"quickstart reward first10={first:.3f} last10={last:.3f} gain={last - first:.3f}")
    assert last - first >= 0.2
    for key in ["reward_mean", "kl", "entropy", "clip_frac", "rollout_tokens_per_s", "train_tokens_per_s", "mfu",
                *(f"time_{p}_s" for p in PHASES), *(f"restarts_{r}" for r in ("actor", "critic", "ref", "reward"))]:
        assert key in rows[-1], key
    assert (tmp_path / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert records[-1].step == job.spec.trainer.steps


def test_grpo_learns_on_ray(ray_session, tmp_path):
    job = load_example("grpo.yaml")
    run_job(job, tmp_path, backend="ray", progress=False)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    first, last = mean(rows[:10]), mean(rows[-10:])
    print(f"grpo reward first10={first:.3f} last10={last:.3f}")
    assert last - first >= 0.2
    assert "time_values_s" not in rows[-1] and "restarts_critic" not in rows[-1]  # no critic in GRPO


def test_roles_run_in_separate_processes_and_placement_groups(ray_session, tmp_path):
    spec = load_example("quickstart.yaml").spec
    driver = Driver(spec, "procs", tmp_path, lambda role: RayWorkerGroup(role, spec), progress=False)
    driver.start()
    try:
        ids = {role: g.identities() for role, g in driver.groups.items()}
        pids = [i["pid"] for group in ids.values() for i in group]
        assert len(set(pids)) == len(pids) == 4 and os.getpid() not in pids
        pgs = {g.pg.id for g in driver.groups.values()}
        assert len(pgs) == 4
    finally:
        driver.shutdown()


@pytest.mark.parametrize(("aggregation", "budget"), [("token-mean", None), ("seq-mean-token-mean", None),
                                                    ("token-mean", 40)])
def test_two_fsdp_ranks_match_one(ray_session, aggregation, budget):
    """One actor update on 2 gloo ranks (FSDP2-sharded) equals the same update on 1 rank, under a token mean and
    under a mean of sequences (the responses' lengths differ: each rank's count of sequences is not its tokens').
    With a token budget the 2 ranks pack their sequences into micro-batches of at most 40 tokens (as many on each
    rank, whatever their lengths), against 1 padded rank of 8-row micro-batches."""
    overrides = {"trainer.ppoEpochs": 1, "trainer.miniBatchSize": 16, "trainer.microBatchSize": 8, "data.batchSize": 16,
                 "algorithm.lossAggregation": aggregation}
    one = load_example("quickstart.yaml", **overrides).spec
    packed = {"trainer.maxTokensPerMicroBatch": budget} if budget else {}
    two = load_example("quickstart.yaml", **overrides, **packed, **{"roles.actor.replicas": 2}).spec
    g1, g2 = RayWorkerGroup("actor", one, worker_cls=ProbedActor), RayWorkerGroup("actor", two, worker_cls=ProbedActor)
    g1.start()
    g2.start()
    try:
        a1, a2 = ActorProxy(g1), ActorProxy(g2)
        driver = Driver(one, "fsdp", Path("/tmp"), lambda r: None, progress=False)
        batch = driver.make_prompts()
        batch.update(a1.generate(batch.select("prompt_ids", "prompt_mask"), seed=1))
        batch.tensors["advantages"] = torch.randn(batch["responses"].shape, generator=torch.Generator().manual_seed(0))
        keys = ("input_ids", "attention_mask", "responses", "response_mask", "old_logprobs", "advantages")
        s1 = a1.update(batch.select(*keys), step=0)
        s2 = a2.update(batch.select(*keys), step=0)
        (w1,), w2 = a1.call(Probes.full_state_dict), a2.call(Probes.full_state_dict)
        assert w2[0].keys() == w1.keys()
        # Adam's first step is lr * g / (|g| + eps): for the odd element whose gradient is ~eps it turns fp32
        # reduction-order noise (one rank's sum against two) into up to ~0.5% of a step, so the weights must
        # agree to a hundredth of one step (lr / 100), with the loss and gradient norm agreeing to 1e-4 below
        step_tol = one.trainer.actor_lr / 100
        for name in w1:
            torch.testing.assert_close(w2[0][name], w1[name], rtol=1e-4, atol=step_tol, msg=name)
            torch.testing.assert_close(w2[1][name], w1[name], rtol=1e-4, atol=step_tol, msg=name)
        assert s2["pg_loss"] == pytest.approx(s1["pg_loss"], rel=1e-4, abs=1e-6)
        assert s2["actor_grad_norm"] == pytest.approx(s1["actor_grad_norm"], rel=1e-4)
    finally:
        g1.shutdown()
        g2.shutdown()


class Stop(Exception):
    """The driver stopped between two steps (what a kill there leaves behind)."""


def run_local(spec: JobSpec, out: Path, driver_cls: type[Driver] = Driver, stops: bool = False, **kw) -> Driver:
    """Run `driver_cls` in-process to the end, or with `stops` until it raises Stop (a driver that stops itself)."""
    driver = driver_cls(spec, "local", out, lambda role: LocalWorkerGroup(role, spec, "cpu"), progress=False, **kw)
    driver.start()
    try:
        if stops:
            with pytest.raises(Stop):
                driver.run()
        else:
            driver.run()
    finally:
        driver.shutdown()
    return driver


def test_every_roles_process_settles_once_after_its_first_step_and_thaws_at_shutdown(netns, tmp_path):
    """kuberl.training.gcfreeze: the driver's and each role's long-lived objects leave the collector's way once per
    group generation (in-process here: one process), and are given back when the roles shut down."""
    import gc

    driver = run_local(load_example("quickstart.yaml", **{"trainer.steps": 2}).spec, tmp_path)
    assert driver.roles.settled == {role: group.generation for role, group in driver.groups.items()}
    assert set(driver.roles.settled) == {"actor", "critic", "ref", "reward"} and gc.get_freeze_count() == 0


def test_resume_is_continuous_and_equals_uninterrupted(netns, tmp_path):
    """Stopped after step 4 and resumed to 8 == one run of 8 steps; metrics.jsonl has steps 1..8 once."""
    base = {"trainer.checkpoint.interval": 2}
    run_local(load_example("quickstart.yaml", **base, **{"trainer.steps": 8}).spec, tmp_path / "whole")
    run_local(load_example("quickstart.yaml", **base, **{"trainer.steps": 4}).spec, tmp_path / "split")
    resumed = run_local(load_example("quickstart.yaml", **base, **{"trainer.steps": 8}).spec, tmp_path / "split")
    whole, split = read_jsonl(tmp_path / "whole" / "metrics.jsonl"), read_jsonl(tmp_path / "split" / "metrics.jsonl")
    assert [r["step"] for r in split] == list(range(1, 9)) and resumed.step == 8
    for a, b in zip(whole, split):
        assert b["reward_mean"] == pytest.approx(a["reward_mean"], abs=1e-6), a["step"]
        assert b["pg_loss"] == pytest.approx(a["pg_loss"], rel=1e-3, abs=1e-6), a["step"]


def test_prometheus_endpoint_serves_step_metrics(netns, tmp_path):
    spec = load_example("quickstart.yaml", **{"trainer.steps": 2, "trainer.metrics.prometheusPort": 0}).spec
    scraped = []

    def scrape(rec):
        port = driver.metrics_port
        scraped.append(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())

    driver = Driver(spec, "prom", tmp_path, lambda role: LocalWorkerGroup(role, spec, "cpu"), progress=False,
                    on_step=scrape)
    driver.start()
    try:
        driver.run()
    finally:
        driver.shutdown()
    assert 'kuberl_reward_mean{job="prom"}' in scraped[-1]
    assert "kuberl_rollout_tokens_per_second" in scraped[-1]
    assert 'kuberl_role_restarts{job="prom",role="critic"} 0.0' in scraped[-1]
    assert 'kuberl_phase_seconds{job="prom",phase="update_actor"}' in scraped[-1]
    assert 'kuberl_role_memory_bytes{job="prom",kind="rss_peak",role="actor"}' in scraped[-1]


def test_reward_model_worker_scores_sequences(netns, tmp_path):
    obj_overrides = {"trainer.steps": 2}
    job = load_example("quickstart.yaml", **obj_overrides)
    spec = JobSpec.model_validate({**job.spec.model_dump(by_alias=True, exclude_none=True),
                                   "reward": {"model": {"builtin": "tiny"}}})
    assert spec.reward.function is None
    run_local(spec, tmp_path)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    # a randomly initialised classification head gives distinct, finite, non-rule scores per sequence
    assert len(rows) == 2 and all(abs(r["reward_mean"]) < 1e3 and r["reward_std"] > 0 for r in rows)


def kuberl(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kuberl.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_run_steps_override_local_backend(netns, tmp_path):
    proc = kuberl("run", "examples/quickstart.yaml", "--out", str(tmp_path), "--steps", "3", "--backend", "local",
                  "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    assert "step 3/3" in proc.stdout and "reward=" in proc.stdout and "tok/s=" in proc.stdout


@pytest.mark.parametrize(
    "change, field",
    [
        ({"data": {"files": ["/nonexistent/prompts.jsonl"]}}, "spec.data.files[0]"),
        ({"reward": {"function": "no_such_pkg.rewards:score"}}, "spec.reward.function"),
        ({"reward": {"function": "kuberl.rewards.builtin:no_such_fn"}}, "spec.reward.function"),
        ({"algorithm": {"advantageEstimator": "no_such_pkg.adv:estimate"}}, "spec.algorithm.advantageEstimator"),
    ],
)
def test_run_preflight_errors_name_the_field(netns, tmp_path, change, field):
    import yaml

    obj = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    obj["spec"].update(change)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(obj))
    proc = kuberl("run", str(job), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error: {field}: ") and "fix:" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing half-created


def test_a_checkpoint_of_a_step_is_void_while_a_role_holds_a_later_update(netns, tmp_path):
    """A checkpoint of completed step s holds step s's state. When the actor has already applied step s+1's update
    (the step not yet counted: a role's restart budget spent after the update, and the driver's final checkpoint),
    a checkpoint named s would resume into that update applied a second time: it is void instead, never complete."""
    from kuberl.resilience import checkpoint

    from .test_offload import train_batch

    spec = load_example("quickstart.yaml", **{"trainer.steps": 3, "trainer.checkpoint.interval": 100}).spec
    driver = Driver(spec, "void", tmp_path, lambda role: LocalWorkerGroup(role, spec, "cpu"), progress=False)
    driver.start()
    try:
        driver.train_step()
        assert driver.step == 1
        keys = ("input_ids", "attention_mask", "responses", "response_mask", "old_logprobs", "advantages")
        driver.roles.actor.update(train_batch(spec, driver.roles.actor).select(*keys), step=driver.step)
        driver.save_checkpoint()
        driver.roles.commit()
        assert checkpoint.latest(driver.ckpt_root) is None
    finally:
        driver.shutdown()

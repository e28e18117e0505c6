"""Phases at the same time on real Ray (kuberl.controller.schedule): the synchronous loop with its independent phases
overlapped gives bit-identical results to one phase after another; each step's timeline shows the overlap;
spec.rollout.asynchronous generates step k+1's batch beside step k's updates and still learns."""

from __future__ import annotations

import urllib.request

import torch

from kuberl.controller.driver import Driver
from kuberl.metrics import read_jsonl
from kuberl.resilience import checkpoint
from kuberl.run import run_job
from kuberl.workers.groups import RayWorkerGroup

from .conftest import load_example
from .probes import PROBED, Probes
from .test_runtime import Stop, run_local

COMPARED = ("reward_mean", "kl", "pg_loss", "vf_loss", "entropy", "clip_frac", "actor_grad_norm", "value_mean")


def spans(rec, phase):
    return [s for s in rec.timeline if s.phase == phase]


def run_steps(tmp_path, name, sequential, **overrides):
    spec = load_example("quickstart.yaml", **{"trainer.steps": 4, **overrides}).spec
    driver = Driver(spec, name, tmp_path / name, lambda r: RayWorkerGroup(r, spec, worker_cls=PROBED.get(r)),
                    progress=False)
    driver.sequential = sequential
    driver.start()
    try:
        records = driver.run()
        weights = {r: driver.groups[r].call(Probes.full_state_dict)[0] for r in ("actor", "critic")}
    finally:
        driver.shutdown()
    return records, weights


def test_overlapped_sync_loop_is_bit_identical_to_sequential(ray_session, tmp_path):
    seq, w_seq = run_steps(tmp_path, "seq", sequential=True)
    ovl, w_ovl = run_steps(tmp_path, "ovl", sequential=False)
    for a, b in zip(seq, ovl):
        fa, fb = a.flat(), b.flat()
        for key in COMPARED:
            assert fa[key] == fb[key], (a.step, key)
    for role in ("actor", "critic"):
        assert w_seq[role].keys() == w_ovl[role].keys()
        for k in w_seq[role]:
            assert w_seq[role][k].equal(w_ovl[role][k]), (role, k)
    # the timeline: sequential spans follow each other; overlapped, ref and values share time
    for rec in seq:
        (ref,), (values,) = spans(rec, "ref"), spans(rec, "values")
        assert not ref.overlaps(values)
    for rec in ovl:
        (ref,), (values,), (reward,) = spans(rec, "ref"), spans(rec, "values"), spans(rec, "reward")
        (rollout,), (upd_a,), (upd_c,) = spans(rec, "rollout"), spans(rec, "update_actor"), spans(rec, "update_critic")
        assert ref.overlaps(values) and reward.overlaps(values)
        assert min(ref.start_s, values.start_s, reward.start_s) >= rollout.end_s
        assert upd_a.overlaps(upd_c)
        assert {s.role for s in rec.timeline} == {"actor", "critic", "ref", "reward", "driver"}
        assert rec.staleness == 0


def test_asynchronous_rollout_learns_and_overlaps_the_update(ray_session, tmp_path):
    """spec.rollout.asynchronous on the quickstart: step k+1's rollout runs beside step k's actor update,
    every batch after the first is one update stale, and the reward still rises by >= 0.2 (as the sync one)."""
    job = load_example("quickstart.yaml", **{"rollout.asynchronous": True})
    records = run_job(job, tmp_path, backend="ray", progress=False)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, job.spec.trainer.steps + 1))
    assert [r["staleness"] for r in rows] == [0] + [1] * (len(rows) - 1)
    first, last = sum(r["reward_mean"] for r in rows[:10]) / 10, sum(r["reward_mean"] for r in rows[-10:]) / 10
    print(f"async quickstart reward first10={first:.3f} last10={last:.3f} gain={last - first:.3f}")
    assert last - first >= 0.2
    for prev, rec in zip(records, records[1:]):
        (upd,), (rollout,) = spans(prev, "update_actor"), spans(rec, "rollout")
        assert rollout.start_s < 0  # sent during the step before
        assert upd.overlaps(rollout, rec.start_s - prev.start_s), rec.step
        (sync,) = spans(prev, "weight_sync")
        assert sync.start_s >= rollout.end_s + rec.start_s - prev.start_s  # the weights change after it is done
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class PromptLog(Driver):
    """A driver that keeps every prompt batch it draws, (step, prompt_ids [B, P]) in the order drawn, and the
    staleness its Prometheus endpoint serves after each step; it stops (raises Stop) after step `stop_after`."""

    def __init__(self, *args, stop_after: int | None = None, **kwargs):
        super().__init__(*args, on_step=self._after_step, **kwargs)
        self.drawn: list[tuple[int, torch.Tensor]] = []
        self.served: list[tuple[int, float]] = []
        self.stop_after = stop_after

    def _send_rollout(self, phases, step):
        rollout = super()._send_rollout(phases, step)
        self.drawn.append((step, rollout.prompts["prompt_ids"].clone()))
        return rollout

    def _after_step(self, rec) -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        text = opener.open(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        (line,) = [ln for ln in text.splitlines() if ln.startswith("kuberl_rollout_staleness_steps{")]
        self.served.append((rec.step, float(line.split()[-1])))
        if rec.step == self.stop_after:
            raise Stop


def test_asynchronous_resume_redraws_the_early_rollouts_prompts(netns, tmp_path):
    """An async run stopped after step 3 (step 2's checkpoint committed, step 4's prompts already drawn for the
    rollout sent ahead) and resumed: the checkpoint holds the data position before step 3's prompts, so the
    resumed run draws steps 3..6 again as the uninterrupted async run drew them (the data order is fixed by
    the spec's seed); metrics.jsonl has steps 1..6 once; the first step after the resume is generated with the
    restored weights (staleness 0), and Prometheus serves each step's staleness."""
    spec = load_example("quickstart.yaml", **{"rollout.asynchronous": True, "trainer.steps": 6,
                                              "trainer.checkpoint.interval": 2,
                                              "trainer.metrics.prometheusPort": 0}).spec
    whole = run_local(spec, tmp_path / "whole", driver_cls=PromptLog)
    stopped = run_local(spec, tmp_path / "split", PromptLog, stops=True, stop_after=3)
    assert checkpoint.latest(tmp_path / "split" / "checkpoints") == 2
    resumed = run_local(spec, tmp_path / "split", driver_cls=PromptLog)

    order = dict(whole.drawn)
    assert [s for s, _ in whole.drawn] == list(range(1, 7))
    assert [s for s, _ in stopped.drawn] == [1, 2, 3, 4] and [s for s, _ in resumed.drawn] == [3, 4, 5, 6]
    for step, prompts in stopped.drawn + resumed.drawn:
        assert prompts.equal(order[step]), f"step {step}: not the prompts the uninterrupted run drew"
    assert not order[3].equal(order[4])  # the check above could not pass by drawing the same batch twice

    rows, rows_whole = (read_jsonl(tmp_path / run / "metrics.jsonl") for run in ("split", "whole"))
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert [r["staleness"] for r in rows_whole] == [0] + [1] * 5
    assert [r["staleness"] for r in rows] == [0, 1, 0, 1, 1, 1]  # resumed at step 3 from step 2's checkpoint
    # the stopped run's step 3 (generated ahead: 1 stale), then the resumed run's (0), as Prometheus served them
    assert stopped.served + resumed.served == [(1, 0.0), (2, 1.0), (3, 1.0), (3, 0.0), (4, 1.0), (5, 1.0), (6, 1.0)]
    for a, b in zip(rows_whole[:2], rows[:2]):  # before the stop both runs are the same computation
        assert b["reward_mean"] == a["reward_mean"] and b["pg_loss"] == a["pg_loss"], a["step"]

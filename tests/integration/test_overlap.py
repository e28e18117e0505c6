"""Phases at the same time on real Ray (kuberl.schedule): the synchronous loop with its independent phases
overlapped gives bit-identical results to one phase after another; each step's timeline shows the overlap;
spec.rollout.asynchronous generates step k+1's batch beside step k's updates and still learns."""

from __future__ import annotations

from kuberl.driver import Driver
from kuberl.groups import RayWorkerGroup
from kuberl.metrics import read_jsonl
from kuberl.run import run_job

from .conftest import load_example
from .probes import PROBED, Probes

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

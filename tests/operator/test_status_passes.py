"""How passes queue: per job, a burst of child events (a job's pods starting) makes at most one pass running and one
waiting, which reads the indices as they are when it runs; across jobs, at most `concurrent_passes` run at once."""

from __future__ import annotations

import asyncio

from kuberl_operator import reconcile
from kuberl_operator.config import OperatorConfig
from kuberl_operator.metrics import Metrics


def test_a_burst_of_changes_makes_one_pass_running_and_one_waiting(monkeypatch) -> None:
    passes: list[str] = []
    gate = asyncio.Event()

    async def write_status(ctx, namespace, name, indices) -> None:
        passes.append(name)
        await gate.wait()

    monkeypatch.setattr(reconcile, "write_status", write_status)
    ctx = reconcile.Context(kube=None, config=OperatorConfig(), metrics=Metrics())

    async def burst() -> None:
        tasks = [asyncio.create_task(reconcile.reconcile_status(ctx, "ns", job, None)) for job in ["a"] * 10 + ["b"]]
        await asyncio.sleep(0.05)
        assert passes == ["a", "b"] and ctx.waiting == {("ns", "a")}  # a: one running, one waiting, 8 dropped
        gate.set()
        await asyncio.gather(*tasks)
        assert passes == ["a", "b", "a"] and not ctx.waiting
        gate.clear()
        late = asyncio.create_task(reconcile.reconcile_status(ctx, "ns", "a", None))
        await asyncio.sleep(0.05)
        waiting = asyncio.create_task(reconcile.reconcile_status(ctx, "ns", "a", None))
        await asyncio.sleep(0.05)
        waiting.cancel()  # cancelled while waiting: the job is not left marked as having a pass waiting
        await asyncio.gather(waiting, return_exceptions=True)
        assert not ctx.waiting
        gate.set()
        await late

    asyncio.run(burst())


def test_at_most_the_configured_passes_run_at_once_and_their_wait_is_measured_apart() -> None:
    ctx = reconcile.Context(kube=None, config=OperatorConfig(concurrent_passes=2), metrics=Metrics())
    inside, most = 0, 0

    async def one_pass(job: str) -> None:
        nonlocal inside, most
        async with ctx.turn("ns", job):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.05)
            inside -= 1

    async def burst() -> None:
        await asyncio.gather(*(one_pass(job) for job in ["a", "a", "b", "c", "d", "e"]))

    asyncio.run(burst())
    assert most == 2
    sample = {s.name: s.value for m in ctx.metrics.registry.collect() for s in m.samples}
    assert sample["kuberl_operator_reconcile_queue_seconds_count"] == 6
    assert sample["kuberl_operator_reconcile_duration_seconds_count"] == 6
    assert sample["kuberl_operator_reconcile_duration_seconds_sum"] < 6 * 0.05 + 0.5  # the passes, not their waits
    assert sample["kuberl_operator_reconcile_queue_seconds_sum"] >= 0.05 * (0 + 0 + 1 + 1 + 2 + 2) - 0.05
    assert not any(lock.locked() for lock in ctx.locks.values())


def test_secret_probes_of_jobs_made_in_one_burst_are_spread_over_the_interval() -> None:
    interval = 900.0
    keys = [("ns", f"job-{i}", f"uid-{i}") for i in range(1000)]
    made = {key: i * 0.3 for i, key in enumerate(keys)}  # a burst: 1,000 jobs in 300 s, each probed when made
    due = {key: reconcile.probe_due(made[key], key, interval) for key in keys}
    # never sooner than 10 minutes after the last (the bound at rest), never later than 25
    assert all(made[k] + 600 <= due[k] < made[k] + 1500 for k in keys)
    # at rest the probes come at the interval's average rate, not the burst's: no 90 s window holds much over a tenth
    times = sorted(due.values())
    busiest = max(sum(1 for t in times if start <= t < start + 90) for start in range(0, 2000, 10))
    assert busiest <= 160, busiest
    for late in (0.0, 29.0):  # then one interval apart, the pass that probes on time or a resync late
        again = [reconcile.probe_due(due[k] + late, k, interval) - due[k] for k in keys]
        assert all(abs(gap - interval) < 1e-6 for gap in again)


def test_a_probe_that_never_answered_is_made_again_on_the_next_pass() -> None:
    """The Secret and NetworkPolicy creates of a pass that failed are tried again by the next resync, not a probe
    interval later: a resync that skipped them would make the RayCluster and its pods without their policy."""
    ctx = reconcile.Context(kube=None, config=OperatorConfig(secret_probe_seconds=900.0), metrics=Metrics())
    key = ("ns", "job", "uid")
    assert ctx.probe_secret(key, forced=False)  # never probed
    assert ctx.probe_secret(key, forced=False)  # asked again, the first pass having failed: still due
    ctx.probed(key)
    assert not ctx.probe_secret(key, forced=False)  # answered: the next waits its turn
    assert ctx.probe_secret(key, forced=True)  # an event of the job probes whatever the turn

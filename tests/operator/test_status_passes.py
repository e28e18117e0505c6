"""How status passes queue per job: a burst of child events (a job's pods starting) makes at most one pass
running and one waiting, which reads the indices as they are when it runs."""

from __future__ import annotations

import asyncio

from kuberl_operator import reconcile


def test_a_burst_of_changes_makes_one_pass_running_and_one_waiting(monkeypatch) -> None:
    passes: list[str] = []
    gate = asyncio.Event()

    async def write_status(ctx, namespace, name, indices) -> None:
        passes.append(name)
        await gate.wait()

    monkeypatch.setattr(reconcile, "write_status", write_status)
    ctx = reconcile.Context(kube=None, config=None, metrics=None)

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

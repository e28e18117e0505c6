"""ReMax (Li et al. 2023) as a program of one's own, written only against kuberl's role API
(`kuberl.library`, docs/library.md): REINFORCE whose baseline is the reward of the greedy response
to the same prompt, so no critic is trained. With an extra `rules` role (examples/rule_engine.py)
in the job, the rule engine's penalties are taken off the reward.

    PYTHONPATH=runtime python -m examples.remax examples/remax.yaml --out runs/remax

Each step: sample a response and decode the greedy one (two calls to the actor, the first one
non-blocking), score both, advantage = r(sample) - r(greedy) on every response token, one policy
update (spec.algorithm.policyLoss), weights into the rollout engine. Every role runs in its own
WorkerGroup; a role that fails is restarted alone and the call replayed (`Roles` does it).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from examples.rule_engine import RuleEngine
from kuberl import algos
from kuberl.data.batch import Batch
from kuberl.library import Fault, Prompts, Roles
from kuberl.metrics import MetricsSink
from kuberl.metrics.record import StepRecord
from kuberl.spec import JobSpec, load_manifest
from kuberl.training.sequence import SEQ_KEYS
from kuberl.workers.groups import WorkerGroup


def scores(roles: Roles, batch: Batch) -> torch.Tensor:
    """The reward role's scores [B], minus the rule engine's penalties when the job has a `rules` role."""
    rules = roles.proxy("rules", RuleEngine) if "rules" in roles.groups else None
    pending = rules.penalties.submit(batch.select(*SEQ_KEYS)) if rules is not None else None  # both roles at once
    score = roles.reward.compute_scores(batch.select(*SEQ_KEYS, "prompt", "answer"))["scores"]
    return score - pending.result()["penalties"] if pending is not None else score


def remax(spec: JobSpec, make_group: Callable[[str], WorkerGroup], out: Path, name: str = "remax",
          faults: list[Fault] | None = None) -> list[StepRecord]:
    """Train for spec.trainer.steps; returns one record per step (also written to out/metrics.jsonl)."""
    prompts = Prompts(spec)
    sink = MetricsSink(out, name, spec.trainer.steps, progress=False)
    records = []
    with Roles(spec, make_group, faults, name=name) as roles:
        actor = roles.actor
        for step in range(1, spec.trainer.steps + 1):
            roles.begin_step(step)
            since, t0 = roles.mark(), time.perf_counter()
            batch = prompts.next_batch()
            asked = batch.select("prompt_ids", "prompt_mask")
            with roles.phase("rollout"):
                sampled = actor.generate.submit(asked, seed=step)  # a future: returns at once
                greedy = actor.generate(asked, seed=step, greedy=True)
                batch.update(sampled.result())
            with roles.phase("reward"):
                reward = scores(roles, batch)
                baseline = scores(roles, Batch(greedy.tensors, batch.meta))
            mask = batch["response_mask"]
            batch.tensors["advantages"] = algos.broadcast_to_tokens(reward - baseline, mask)
            batch.meta["kl_coef"] = [0.0] * len(batch)
            with roles.phase("update_actor"):
                stats = actor.update(batch.select(*SEQ_KEYS, "old_logprobs", "advantages", "kl_coef"), step=step - 1)
                actor.sync_weights()
            memory = roles.memory()
            roles.end_step()
            rec = StepRecord(step=step, reward_mean=float(reward.mean()),
                             response_length_mean=float(mask.sum()) / len(batch),
                             stats={**stats, "baseline_mean": float(baseline.mean())},
                             roles=roles.role_steps(since, memory), step_s=time.perf_counter() - t0)
            sink.log(rec)
            records.append(rec)
    sink.close()
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="ReMax on kuberl's role API")
    ap.add_argument("job", help="an RLTrainingJob manifest (algorithm.name reinforce: no critic)")
    ap.add_argument("--out", default="runs/remax")
    ap.add_argument("--steps", type=int, help="override spec.trainer.steps")
    args = ap.parse_args(argv)
    job = load_manifest(args.job)
    spec = job.spec
    if args.steps:
        spec = spec.model_copy(update={"trainer": spec.trainer.model_copy(update={"steps": args.steps})})
    import ray

    from kuberl.run import start_local_ray
    from kuberl.spec.colocation import SharedPlacement
    from kuberl.workers.groups import RayWorkerGroup

    start_local_ray(spec)
    shared = SharedPlacement(spec)  # the placement groups of roles that share GPUs (colocateWith), if any
    try:
        records = remax(spec, lambda role: RayWorkerGroup(role, spec, shared=shared), Path(args.out),
                        job.metadata.name)
    finally:
        ray.shutdown()
    first, last = records[: min(10, len(records))], records[-min(10, len(records)):]
    mean = lambda rs: sum(r.reward_mean for r in rs) / len(rs)  # noqa: E731
    print(f"done: {len(records)} steps; reward first10={mean(first):.3f} last10={mean(last):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

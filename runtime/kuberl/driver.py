"""The single controller's built-in program: the PPO/GRPO loop, written on `kuberl.library.Roles`.

One step (each phase timed):
    rollout      actor   prompts -> responses, old log-probs
    reward       reward  responses -> scores [B]
    ref          ref     ref log-probs [B,R]
    values       critic  values [B,R]                      (ppo)
    advantage    driver  the advantage estimator (GAE for ppo, group-normalised scores for grpo), KL
    update_critic, update_actor, weight_sync (actor -> its rollout engine)

When a role's worker dies or hangs, `Roles` restarts only that role's group, restores it (actor,
critic: last checkpoint; ref, reward: model path) and replays the interrupted call. The driver's
output is one `StepRecord` per step, which every sink is written from.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from . import algos, checkpoint, elastic
from .batch import Batch
from .evaluation import Evaluator, common_ranks
from .groups import WorkerGroup, world_size
from .library import STATEFUL, Fault, JobFailed, PlacementDegraded, Prompts, RoleHistory, Roles
from .metrics import MetricsSink, mfu
from .record import RoleStep, StepRecord
from .spec import JobSpec, SpecInvalid
from .tasks import META_KEYS
from .tracking import make_trackers

__all__ = ["Driver", "Fault", "JobFailed", "PlacementDegraded"]
SEQ = ("input_ids", "attention_mask", "responses", "response_mask")


class Driver:
    def __init__(self, spec: JobSpec, name: str, out_dir: Path, make_group: Callable[[str], WorkerGroup],
                 faults: list[Fault] | None = None, progress: bool = True,
                 on_step: Callable[[StepRecord], None] | None = None):
        self.spec, self.name, self.out = spec, name, out_dir
        self.progress, self.on_step = progress, on_step
        self.ckpt_root = checkpoint.root_for(spec, out_dir)
        self.roles = Roles(spec, make_group, faults, self.ckpt_root, name)
        self.roles.on_budget_spent.append(self._final_checkpoint)
        self.prompts = Prompts(spec)
        self.loader = self.prompts.loader
        ranks = common_ranks([world_size(spec, r) for r in ("actor", "reward")])
        self.evaluator = Evaluator.for_spec(spec, self.prompts.tokenizer, ranks)
        a = spec.algorithm
        self.kl_ctl = algos.make_kl_controller(a.kl.controller, a.kl.coef, a.kl.target, a.kl.horizon)
        self.loader_at_step_start = self.loader.state_dict()
        self.metrics_port: int | None = None

    # -- what the roles hold -----------------------------------------------------------------------
    @property
    def step(self) -> int:
        """Completed steps."""
        return self.roles.step

    @property
    def groups(self) -> dict[str, WorkerGroup]:
        return self.roles.groups

    @property
    def history(self) -> dict[str, RoleHistory]:
        return self.roles.history

    @property
    def worst_links(self) -> dict[str, str | None]:
        return self.roles.worst_links

    # -- setup and state ---------------------------------------------------------------------------
    def start(self) -> None:
        self.roles.start()
        checkpoint.prune_incomplete(self.ckpt_root)
        resume = checkpoint.latest(self.ckpt_root)
        if resume is not None:
            self._restore_driver(resume)
            self.roles.load_checkpoint(resume)
        self.peak_flops = self.roles.actor.measure_peak_flops()
        self.n_params = self.roles.actor.num_params()

    def _restore_driver(self, step: int) -> None:
        state = checkpoint.read_state(self.ckpt_root, step)
        self.roles.step = self.roles.last_checkpoint = state["step"]
        self.loader.load_state_dict(state["data"])
        self.kl_ctl.load_state_dict(state["kl_controller"])
        for role, n in state.get("restarts", {}).items():
            if role in self.history:
                self.history[role].restarts = n
        for f in self.roles.faults:
            f.fired = f.fired or f.step <= self.step

    def save_checkpoint(self, data_state: dict[str, int] | None = None) -> None:
        """Start checkpointing the completed step `self.step` (its writes overlap the next step, which
        commits it). `data_state` is the data position after that step (default: the loader's position
        now, which is right between steps)."""
        state = {"step": self.step, "data": data_state or self.loader.state_dict(),
                 "kl_controller": self.kl_ctl.state_dict(),
                 "restarts": {r: h.restarts for r, h in self.history.items()}}
        self.roles.save_checkpoint(self.step, state)

    def _final_checkpoint(self, failed_role: str) -> None:
        """Past the budget: checkpoint the last completed step when the failed role holds no trainable
        state; otherwise the last periodic checkpoint is already the newest consistent state."""
        self.roles.commit(dead=failed_role)  # a checkpoint in flight first
        if failed_role not in STATEFUL and self.step > self.roles.last_checkpoint:
            self.save_checkpoint(data_state=self.loader_at_step_start)
            self.roles.commit(dead=failed_role)

    def shutdown(self) -> None:
        self.roles.shutdown()

    # -- the training step -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _timed(self, phase: str, times: dict[str, float]) -> Iterator[None]:
        t0 = time.perf_counter()
        with self.roles.phase(phase):
            yield
        times[phase] = times.get(phase, 0.0) + time.perf_counter() - t0

    def make_prompts(self) -> Batch:
        return self.prompts.next_batch()

    def train_step(self) -> StepRecord:
        roles, times = self.roles, {}
        actor, critic, ref, reward = roles.actor, roles.critic, roles.ref, roles.reward
        t_step = time.perf_counter()
        since = roles.mark()
        roles.begin_step(self.step + 1)
        self.loader_at_step_start = self.loader.state_dict()
        batch = self.make_prompts()
        seed = self.spec.trainer.seed * 100_003 + self.step
        with self._timed("rollout", times):
            batch.update(actor.generate(batch.select("prompt_ids", "prompt_mask"), seed=seed))
        with self._timed("reward", times):
            batch.update(reward.compute_scores(batch.select(*SEQ, *META_KEYS)))
        if ref is not None:
            with self._timed("ref", times):
                batch.update(ref.compute_ref_logprobs(batch.select(*SEQ)))
        if critic is not None:
            with self._timed("values", times):
                batch.update(critic.compute_values(batch.select(*SEQ)))
        with self._timed("advantage", times):
            stats = self.compute_advantages(batch)
        if critic is not None:
            with self._timed("update_critic", times):
                stats.update(critic.update(batch.select(*SEQ, "values", "returns"), step=self.step))
        ref_keys = ("ref_logprobs",) if "ref_logprobs" in batch.tensors else ()
        actor_keys = (*SEQ, "old_logprobs", "advantages", *ref_keys)
        with self._timed("update_actor", times):
            stats.update(actor.update(batch.select(*actor_keys, "kl_coef"), step=self.step))
        with self._timed("weight_sync", times):
            sync = max(actor.sync_weights())
        if self.evaluator is not None and self.evaluator.due(self.step + 1):
            with self._timed("eval", times):
                stats.update(self.evaluator.run(actor, reward))
        memory = roles.memory()
        roles.end_step()
        tr = self.spec.trainer
        if self.step % tr.checkpoint.interval == 0 or self.step == tr.steps:
            with self._timed("checkpoint", times):  # staging only: the writes overlap the next step
                self.save_checkpoint()
        rec = self.record(batch, stats, times, sync, roles.role_steps(since, memory))
        rec.step_s = time.perf_counter() - t_step
        return rec

    def apply_scale_requests(self) -> None:
        """Between two steps: resize the frozen roles `kuberl scale` asked for (kuberl.elastic). A request
        that breaks a rule is refused with one line naming it; the job goes on as it was."""
        for role, replicas in elastic.take_requests(self.out).items():
            problem = elastic.request_problem(role, replicas)
            if problem is None and role not in self.groups:
                problem = f"role {role} does not run in this job"
            spec = None
            try:
                spec = elastic.rescaled(self.spec, role, replicas) if problem is None else None
            except SpecInvalid as exc:
                problem = "; ".join(str(e) for e in exc.errors)
            if spec is None:
                print(f"[{self.name}] scale refused: {problem}", flush=True)
                continue
            before = self.roles.rescale(spec, role)
            self.spec = spec
            ranks = common_ranks([world_size(spec, r) for r in ("actor", "reward")])
            self.evaluator = Evaluator.for_spec(spec, self.prompts.tokenizer, ranks)
            print(f"[{self.name}] scaled {role} from {before} to {self.roles.groups[role].world_size} ranks "
                  f"after step {self.step}; other roles untouched", flush=True)

    def compute_advantages(self, batch: Batch) -> dict[str, float]:
        """Pure tensor work on the driver: KL, token rewards, then the spec's advantage estimator."""
        algo, mask = self.spec.algorithm, batch["response_mask"]
        stats: dict[str, float] = {}
        kl = None
        if "ref_logprobs" in batch.tensors:
            kl = algos.kl_penalty(batch["old_logprobs"], batch["ref_logprobs"], algo.kl.estimator)
            stats["kl"] = float(algos.masked_mean(kl, mask))
            stats["kl_seq"] = float(algos.masked_sum(kl, mask, dim=-1).mean())
        kl_coef = self.kl_ctl.value  # this batch is shaped with the coefficient the step started with
        if kl is not None:
            self.kl_ctl.update(stats["kl_seq"], len(batch))
        shaped_kl = kl if algo.kl_in_reward else None
        inputs = algos.AdvantageInputs(
            token_rewards=algos.token_rewards(batch["scores"], mask, shaped_kl, kl_coef), mask=mask,
            group_index=batch["group_index"], values=batch.tensors.get("values"), gamma=algo.gamma, lam=algo.lam,
            whiten=algo.normalize_advantages)
        adv, returns = algos.ADVANTAGE_ESTIMATORS.get(algo.estimator)(inputs)
        if returns is not None:
            batch.tensors["returns"] = returns
            stats["return_mean"] = float(algos.masked_mean(returns, mask))
        if inputs.values is not None:
            stats["value_mean"] = float(algos.masked_mean(inputs.values, mask))
        batch.tensors["advantages"] = adv
        batch.meta["kl_coef"] = [kl_coef] * len(batch)
        stats["kl_coef"] = kl_coef
        return stats

    def record(self, batch: Batch, stats: dict[str, float], times: dict[str, float], sync_s: float,
               roles: dict[str, RoleStep]) -> StepRecord:
        mask, scores = batch["response_mask"], batch["scores"]
        resp_tokens = float(mask.sum())
        seq_tokens = float(batch["attention_mask"].sum())
        gen_s = max(batch.meta["gen_seconds"]) if batch.meta.get("gen_seconds") else times["rollout"]
        train_tokens = seq_tokens * self.spec.trainer.ppo_epochs
        upd = times.get("update_actor", 0.0)
        return StepRecord(
            step=self.step,
            reward_mean=float(scores.mean()),
            reward_std=float(scores.std()) if len(scores) > 1 else 0.0,
            response_length_mean=resp_tokens / len(batch),
            stats=stats,
            phases=times,
            weight_sync_worker_s=sync_s,
            rollout_tokens_per_s=resp_tokens / gen_s if gen_s > 0 else 0.0,
            train_tokens_per_s=train_tokens / upd if upd > 0 else 0.0,
            mfu=mfu(self.n_params, train_tokens, upd, self.peak_flops, self.roles.actor.world_size),
            mfu_peak_tflops=self.peak_flops / 1e12,
            n_params=self.n_params,
            roles=roles,
        )

    def run(self) -> list[StepRecord]:
        """Train to spec.trainer.steps, checkpointing every interval; returns this run's records."""
        tr = self.spec.trainer
        sink = MetricsSink(self.out, self.name, tr.steps, self.step, self.progress,
                           tr.metrics.prometheus_port, tr.metrics.prometheus_address)
        for tracker in make_trackers(self.spec, self.out, self.name, self.step):
            sink.add(tracker)
        self.metrics_port = sink.port
        records = []
        try:
            while self.step < tr.steps:
                self.apply_scale_requests()
                rec = self.train_step()
                sink.log(rec)  # a checkpoint is committed by the next step, before that step's record
                records.append(rec)
                if self.on_step:
                    self.on_step(rec)
            self.roles.commit()  # the last checkpoint's writes
        finally:
            sink.close()
        return records

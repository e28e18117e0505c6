"""The single controller: one process owns the PPO/GRPO loop and calls methods on role WorkerGroups.

One step (each phase timed):
    rollout      actor   prompts -> responses, old log-probs
    reward       reward  responses -> scores [B]
    ref          ref     ref log-probs [B,R]
    values       critic  values [B,R]                      (ppo)
    advantage    driver  GAE (ppo) or group-normalised scores (grpo), KL shaping
    update_critic, update_actor, weight_sync (actor -> its rollout engine)

When a role's worker dies or hangs, only that role's group is torn down, recreated, restored (actor,
critic: last checkpoint; ref, reward: model path) and the interrupted phase is replayed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from . import algos, checkpoint
from .batch import Batch
from .evaluation import Evaluator, common_ranks
from .groups import WorkerFailure, WorkerGroup, world_size
from .metrics import MetricsSink, mfu
from .tracking import make_trackers
from .models import load_tokenizer
from .spec import JobSpec, enabled_roles
from .tasks import META_KEYS, PromptLoader, load_rows, prompt_batch

STATEFUL = ("actor", "critic")


class JobFailed(RuntimeError):
    """The job cannot go on (a role spent its restart budget); the message names the role and reason."""

    reason = "ReachedMaxRestarts"


class PlacementDegraded(JobFailed):
    """`spec.placement.policy: required` and a role's GPU groups are linked below `minLink`."""

    reason = "PlacementDegraded"


@dataclass
class Fault:
    role: str
    step: int
    mode: str = "kill"  # kill | hang
    fired: bool = False


@dataclass
class Recovery:
    role: str
    step: int
    phase: str
    reason: str
    detect_s: float
    ready_s: float = 0.0
    replay_s: float = 0.0
    steps_lost: int = 0
    restored_from: str = ""


@dataclass
class RoleHealth:
    restarts: int = 0
    recoveries: list[Recovery] = field(default_factory=list)


class Driver:
    def __init__(self, spec: JobSpec, name: str, out_dir: Path, make_group: Callable[[str], WorkerGroup],
                 faults: Optional[list[Fault]] = None, progress: bool = True,
                 on_step: Optional[Callable[[dict[str, Any]], None]] = None):
        self.spec, self.name, self.out = spec, name, out_dir
        self.make_group = make_group
        self.roles = enabled_roles(spec)
        self.faults = faults or []
        self.progress, self.on_step = progress, on_step
        self.ckpt_root = checkpoint.root_for(spec, out_dir)
        self.tokenizer = load_tokenizer(spec.model)
        self.tokenizer.truncation_side = "left"
        self.loader = PromptLoader(load_rows(spec.data), spec.data.batch_size, spec.trainer.seed, spec.data.shuffle)
        ranks = common_ranks([world_size(spec, r) for r in ("actor", "reward")])
        self.evaluator = Evaluator.for_spec(spec, self.tokenizer, ranks)
        a = spec.algorithm
        self.kl_ctl = algos.make_kl_controller(a.kl.controller, a.kl.coef, a.kl.target, a.kl.horizon)
        self.health = {r: RoleHealth() for r in self.roles}
        self.groups: dict[str, WorkerGroup] = {}
        self.worst_links: dict[str, Optional[str]] = {}
        self.topology_sources: dict[str, str] = {}  # role -> where its ranks read the links (nvml, nvidia-smi, none)
        self.loader_at_step_start = self.loader.state_dict()
        self.step = 0
        self.last_ckpt = 0
        self.phase = ""

    # -- setup and state ---------------------------------------------------------------------------
    def start(self) -> None:
        for role in self.roles:
            self.groups[role] = self.make_group(role)
            self.groups[role].launch()
        for role in self.roles:
            self.groups[role].wait_ready()
        resume = checkpoint.latest(self.ckpt_root)
        if resume is not None:
            self._restore_driver(resume)
            for role in STATEFUL:
                if role in self.groups:
                    self.groups[role].call("load", path=str(checkpoint.step_dir(self.ckpt_root, resume) / role))
        self.check_placement()
        self.peak_flops = self.groups["actor"].call("measure_peak_flops")[0]
        self.n_params = self.groups["actor"].call("num_params")[0]

    def check_placement(self, roles: Optional[list[str]] = None) -> None:
        """Record each role's worst GPU link; under `required`, refuse to train below minLink."""
        from .placement import placement_problem

        problems = []
        for role in roles or list(self.groups):
            group = self.groups[role]
            infos = group.call("placement_info")
            links = [p["worst_link"] for p in infos if p["worst_link"]]
            self.worst_links[role] = min(links, key=_link_rank) if links else None
            self.topology_sources[role] = ",".join(sorted({p["topology_source"] for p in infos if p["topology_source"]}))
            problem = placement_problem(self.spec, role, self.worst_links[role])
            if problem:
                problems.append(problem)
        if problems:
            raise PlacementDegraded("; ".join(problems))

    def _restore_driver(self, step: int) -> None:
        state = checkpoint.read_state(self.ckpt_root, step)
        self.step = self.last_ckpt = state["step"]
        self.loader.load_state_dict(state["data"])
        self.kl_ctl.load_state_dict(state["kl_controller"])
        for role, n in state.get("restarts", {}).items():
            if role in self.health:
                self.health[role].restarts = n
        for f in self.faults:
            f.fired = f.fired or f.step <= self.step

    def save_checkpoint(self, data_state: Optional[dict[str, int]] = None) -> None:
        """Checkpoint the completed step `self.step`. `data_state` is the data position after that
        step (default: the loader's position now, which is right between steps)."""
        d = checkpoint.fresh_step_dir(self.ckpt_root, self.step)
        for role in STATEFUL:
            if role in self.groups:
                self._call(role, "save", path=str(d / role))
        state = {"step": self.step, "data": data_state or self.loader.state_dict(), "kl_controller": self.kl_ctl.state_dict(),
                 "restarts": {r: h.restarts for r, h in self.health.items()}}
        checkpoint.write_state(self.ckpt_root, self.step, state, self.spec.trainer.checkpoint.keep)
        self.last_ckpt = self.step

    def shutdown(self) -> None:
        for group in self.groups.values():
            group.shutdown()

    # -- fault handling ----------------------------------------------------------------------------
    def _pending_fault(self, role: str) -> Optional[str]:
        for f in self.faults:
            if f.role == role and f.step == self.step + 1 and not f.fired:
                f.fired = True
                return f.mode
        return None

    def _call(self, role: str, method: str, batch: Optional[Batch] = None, **kwargs: Any) -> Any:
        """Call a role; on WorkerFailure restart only that role and replay this call."""
        fault = self._pending_fault(role) if method not in ("save", "load") else None
        t_call = time.perf_counter()
        try:
            return self.groups[role].call(method, batch, fault=fault, **kwargs)
        except WorkerFailure as failure:
            rec = Recovery(role, self.step + 1, self.phase, failure.reason, detect_s=time.perf_counter() - t_call)
        self._restart(rec)
        t_replay = time.perf_counter()
        result = self._call(role, method, batch, **kwargs)
        rec.replay_s = time.perf_counter() - t_replay
        return result

    def _restart(self, rec: Recovery) -> None:
        """Recreate only `rec.role`'s group and restore its state. A recreate that fails again (no
        capacity in time, a rank dying during start) counts as another restart of the same budget."""
        role, health = rec.role, self.health[rec.role]
        budget = getattr(self.spec.roles, role).max_restarts
        group = self.groups[role]
        t0 = time.perf_counter()
        while True:
            if health.restarts >= budget:
                self._final_checkpoint(role)
                raise JobFailed(f"role {role} failed at step {rec.step} ({rec.reason}) and reached maxRestarts={budget} "
                                f"(spec.roles.{role}.maxRestarts); last checkpoint: step {self.last_ckpt}")
            health.restarts += 1
            print(f"[{self.name}] role {role} failed in phase {rec.phase} of step {rec.step}: {rec.reason}; "
                  f"restarting {role} only ({health.restarts}/{budget})", flush=True)
            group.shutdown()
            try:
                group.start()
                rec.restored_from = self._restore(role, group) if role in STATEFUL else "model path"
                break
            except WorkerFailure as again:
                rec.reason = f"{rec.reason}; recreating it failed: {again.reason}"
        restored = rec.restored_from.startswith("checkpoint")
        rec.steps_lost = 0 if role not in STATEFUL else (self.step - self.last_ckpt if restored else self.step)
        self.check_placement([role])
        rec.ready_s = time.perf_counter() - t0
        health.recoveries.append(rec)

    def _restore(self, role: str, group: WorkerGroup) -> str:
        """Load the role's last checkpoint when its new ranks can see it (shared storage); else the role
        starts again from the model path. Returns where the state came from."""
        if self.last_ckpt == 0:
            return "model path"
        path = str(checkpoint.step_dir(self.ckpt_root, self.last_ckpt) / role)
        if not all(group.call("has_checkpoint", path=path)):
            print(f"[{self.name}] warning: the new {role} ranks cannot see {path} (no shared checkpoint volume: "
                  f"spec.trainer.checkpoint.volumeClaim); {role} restarts from the model path", flush=True)
            return "model path (checkpoint not visible to the new ranks)"
        group.call("load", path=path)
        return f"checkpoint step {self.last_ckpt}"

    def _final_checkpoint(self, failed_role: str) -> None:
        """Past the budget: checkpoint the last completed step when the failed role holds no trainable
        state; otherwise the last periodic checkpoint is already the newest consistent state."""
        if failed_role not in STATEFUL and self.step > self.last_ckpt:
            self.save_checkpoint(data_state=self.loader_at_step_start)

    # -- the training step -------------------------------------------------------------------------
    def _timed(self, phase: str, times: dict[str, float], fn: Callable[[], Any]) -> Any:
        self.phase = phase
        t0 = time.perf_counter()
        out = fn()
        times[f"time_{phase}_s"] = times.get(f"time_{phase}_s", 0.0) + time.perf_counter() - t0
        return out

    def make_prompts(self) -> Batch:
        spec = self.spec
        return prompt_batch(self.loader.next_batch(), self.tokenizer, spec.samples_per_prompt, spec.data.max_prompt_length)

    def train_step(self) -> dict[str, Any]:
        spec = self.spec
        times: dict[str, float] = {}
        t_step = time.perf_counter()
        recoveries_before = {r: len(h.recoveries) for r, h in self.health.items()}
        self.loader_at_step_start = self.loader.state_dict()
        batch = self.make_prompts()
        seed = spec.trainer.seed * 100_003 + self.step
        batch.update(self._timed("rollout", times, lambda: self._call("actor", "generate", batch.select("prompt_ids", "prompt_mask"), seed=seed)))
        seq = ("input_ids", "attention_mask", "responses", "response_mask")
        scoring = batch.select(*seq, *META_KEYS)
        batch.update(self._timed("reward", times, lambda: self._call("reward", "compute_scores", scoring)))
        if "ref" in self.groups:
            batch.update(self._timed("ref", times, lambda: self._call("ref", "compute_ref_logprobs", batch.select(*seq))))
        if "critic" in self.groups:
            batch.update(self._timed("values", times, lambda: self._call("critic", "compute_values", batch.select(*seq))))
        stats = self._timed("advantage", times, lambda: self.compute_advantages(batch))
        if "critic" in self.groups:
            stats.update(self._timed("update_critic", times, lambda: self._call("critic", "update", batch.select(*seq, "values", "returns"), step=self.step)[0]))
        actor_keys = (*seq, "old_logprobs", "advantages", *(("ref_logprobs",) if "ref_logprobs" in batch.tensors else ()))
        actor_batch = batch.select(*actor_keys, "kl_coef")
        stats.update(self._timed("update_actor", times, lambda: self._call("actor", "update", actor_batch, step=self.step)[0]))
        sync = self._timed("weight_sync", times, lambda: self._call("actor", "sync_weights"))
        if self.evaluator is not None and self.evaluator.due(self.step + 1):
            stats.update(self._timed("eval", times, lambda: self.evaluator.run(self._call)))
        for role in self.groups:
            for kind, value in self._call(role, "memory")[0].items():
                stats[f"memory_{role}_{kind}_bytes"] = value
        self.step += 1
        times["time_step_s"] = time.perf_counter() - t_step
        return self.record(batch, stats, times, max(sync), recoveries_before)

    def compute_advantages(self, batch: Batch) -> dict[str, float]:
        """Pure tensor work on the driver: KL, token rewards, advantages, returns."""
        algo, mask = self.spec.algorithm, batch["response_mask"]
        scores = batch["scores"]
        stats: dict[str, float] = {}
        kl = None
        if "ref_logprobs" in batch.tensors:
            kl = algos.kl_penalty(batch["old_logprobs"], batch["ref_logprobs"], algo.kl.estimator)
            seq_kl = algos.masked_sum(kl, mask, dim=-1)
            stats["kl"] = float(algos.masked_mean(kl, mask))
            stats["kl_seq"] = float(seq_kl.mean())
        kl_coef = self.kl_ctl.value  # this batch is shaped with the coefficient the step started with
        if kl is not None:
            self.kl_ctl.update(stats["kl_seq"], len(batch))
        if algo.name == "ppo":
            shaped_kl = kl if (kl is not None and algo.kl.in_reward) else None
            rewards = algos.token_rewards(scores, mask, shaped_kl, kl_coef)
            adv, returns = algos.gae_advantages(rewards, batch["values"], mask, algo.gamma, algo.lam)
            if algo.normalize_advantages:
                adv = algos.masked_whiten(adv, mask)
            batch.tensors["returns"] = returns
            stats["value_mean"] = float(algos.masked_mean(batch["values"], mask))
            stats["return_mean"] = float(algos.masked_mean(returns, mask))
        else:
            adv = algos.broadcast_to_tokens(algos.grpo_advantages(scores, batch["group_index"]), mask)
        batch.tensors["advantages"] = adv
        batch.meta["kl_coef"] = [kl_coef] * len(batch)
        stats["kl_coef"] = kl_coef
        return stats

    def record(self, batch: Batch, stats: dict[str, Any], times: dict[str, float], sync_s: float,
               recoveries_before: dict[str, int]) -> dict[str, Any]:
        mask, scores = batch["response_mask"], batch["scores"]
        resp_tokens = float(mask.sum())
        seq_tokens = float(batch["attention_mask"].sum())
        gen_s = max(batch.meta["gen_seconds"]) if batch.meta.get("gen_seconds") else times["time_rollout_s"]
        train_tokens = seq_tokens * self.spec.trainer.ppo_epochs
        upd = times.get("time_update_actor_s", 0.0)
        actor_devices = self.groups["actor"].world_size
        rec: dict[str, Any] = {
            "step": self.step,
            "reward_mean": float(scores.mean()),
            "reward_std": float(scores.std()) if len(scores) > 1 else 0.0,
            "response_length_mean": resp_tokens / len(batch),
            **stats,
            **times,
            "weight_sync_worker_s": sync_s,
            "rollout_tokens_per_s": resp_tokens / gen_s if gen_s > 0 else 0.0,
            "train_tokens_per_s": train_tokens / upd if upd > 0 else 0.0,
            "mfu": mfu(self.n_params, train_tokens, upd, self.peak_flops, actor_devices),
            "mfu_peak_tflops": self.peak_flops / 1e12,
            "n_params": self.n_params,
        }
        for role, link in self.worst_links.items():
            if link:
                rec[f"worst_link_{role}"] = link
                rec[f"topology_source_{role}"] = self.topology_sources.get(role) or "none"
        for role, h in self.health.items():
            rec[f"restarts_{role}"] = h.restarts
            for r in h.recoveries[recoveries_before.get(role, 0):]:
                rec[f"recovery_{role}_detect_s"] = r.detect_s
                rec[f"recovery_{role}_ready_s"] = r.ready_s
                rec[f"recovery_{role}_replay_s"] = r.replay_s
                rec[f"recovery_{role}_total_s"] = r.detect_s + r.ready_s + r.replay_s
                rec[f"steps_lost_{role}"] = r.steps_lost
        return rec

    def run(self) -> list[dict[str, Any]]:
        """Train to spec.trainer.steps, checkpointing every interval; returns this run's records."""
        tr = self.spec.trainer
        sink = MetricsSink(self.out, self.name, tr.steps, self.step, self.progress,
                           tr.metrics.prometheus_port, tr.metrics.prometheus_address,
                           make_trackers(self.spec, self.out, self.name, self.step))
        self.metrics_port = sink.port
        records = []
        try:
            while self.step < tr.steps:
                rec = self.train_step()
                sink.log(rec)  # before the checkpoint: a resume truncates records past its step
                if self.step % tr.checkpoint.interval == 0 or self.step == tr.steps:
                    self.save_checkpoint()
                records.append(rec)
                if self.on_step:
                    self.on_step(rec)
        finally:
            sink.close()
        return records


def _link_rank(level: str) -> float:
    """Order for picking the worst link: unknown counts as worst."""
    from .topology import link_score

    return -1.0 if level == "unknown" else link_score(level)

"""Actor: FSDP2 policy training plus a rollout engine fed with the policy's weights after each update."""

from __future__ import annotations

import time
from typing import Any

import torch

from kuberl import algos
from kuberl.data.batch import Batch
from kuberl.envs import environment_factory
from kuberl.envs.remote import EnvEndpoints
from kuberl.rollout import make_engine, response_batch
from kuberl.rollout.multiturn import MultiTurnRollout, turn_spec
from kuberl.spec import enabled_roles
from kuberl.training import lora
from kuberl.training.micro import map_rows, micro_rows
from kuberl.training.models import load_causal_lm
from kuberl.training.packing import use_varlen
from kuberl.training.sequence import response_logprobs
from kuberl.training.trainer import FSDPTrainer
from kuberl.workers.dispatch import Dispatch, register

from .base import Worker


class ActorWorker(Worker):
    def setup(self) -> None:
        tr = self.spec.trainer
        policy = load_causal_lm(self.spec.model, seed=tr.seed)
        if self.spec.model.gradient_checkpointing:
            policy.gradient_checkpointing_enable()
        if tr.packed:
            use_varlen(policy)
        self.trainer = FSDPTrainer.for_role(self, policy)
        env = self.spec.environment
        self.engine = make_engine(turn_spec(self.spec) if env else self.spec, self.device, self.dtype, self.tokenizer)
        in_actor = env is not None and "env" not in enabled_roles(self.spec)  # else `connect_env` makes it
        self.episodes = MultiTurnRollout(self.spec, self.engine, self.tokenizer, environment_factory(
            env, prompt_key=self.spec.data.prompt_key)) if in_actor else None
        self.sync_weights()

    @register(Dispatch.ALL, faults=False, state=False, repeatable=True)
    def connect_env(self, ranks: list[Any]) -> None:
        """The env role's ranks (spec.roles.env: Ray actor handles, or in-process workers) that hold this rank's
        trajectories' environments from now on; sent after that role or this one (re)started."""
        env = self.spec.environment
        assert env is not None, "connect_env: this job has no spec.environment"
        endpoints = EnvEndpoints(ranks, self.rank, env.timeout_seconds, env.concurrency)
        self.episodes = MultiTurnRollout(self.spec, self.engine, self.tokenizer, endpoints.make, endpoints.release,
                                         endpoints.concurrency)

    def resident_modules(self) -> list[torch.nn.Module]:
        """The policy, and the engine's own (the hf engine's model unless CUDA graphs captured its buffers)."""
        return [*super().resident_modules(), *self.engine.resident_modules()]

    @register(Dispatch.ALL, repeatable=True)
    def sync_weights(self) -> float:
        """Copy the (unsharded) policy weights into the rollout engine; returns this rank's seconds."""
        t0 = time.perf_counter()
        self.engine.load_weights(self.trainer.full_state_dict())
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    @register(Dispatch.SPLIT, repeatable=True)
    @torch.no_grad()
    def generate(self, batch: Batch, seed: int, greedy: bool = False) -> Batch:
        """Prompts -> responses, masks and old log-probs. Adds: responses [B,R], response_mask [B,R],
        input_ids/attention_mask [B,P+R], old_logprobs [B,R], the engine's own rollout_logprobs [B,R] where it
        gives them (`RolloutEngine.rollout_logprobs`, 0 past a response's end); meta gen_seconds. `greedy`: the most
        likely token at every step instead of sampling (e.g. ReMax's baseline).

        The old log-probs are the behaviour policy's: the trained model's, which the engine holds too
        (synced after every update), or under spec.rollout.asynchronous the engine model's own, since
        the trained model is being updated meanwhile (this call runs beside `update`).

        Under spec.environment the batch brings meta `row` (a data row per trajectory) and the responses are
        multi-turn trajectories (`kuberl.rollout.multiturn`): observations inside them are masked out of
        response_mask; env_rewards [B, R] and meta env_turns, env_failure, turn_ends, truncated come too."""
        t0 = time.perf_counter()
        if self.spec.environment is not None:
            if self.episodes is None:
                raise RuntimeError("the env role's ranks were never given to the actor (Roles wires them: connect_env)")
            out = self.episodes.run(batch.meta["row"], seed + self.rank, self.device).to(self.device)
        else:
            out = self._responses(batch["prompt_ids"], batch["prompt_mask"], seed + self.rank, greedy)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        gen_s = time.perf_counter() - t0
        behaviour = self.engine.behaviour_model() if self.spec.rollout.asynchronous else self.trainer.model
        out.tensors["old_logprobs"] = self._logprobs(out, behaviour)
        return Batch({k: v.cpu() for k, v in out.tensors.items()}, {**out.meta, "gen_seconds": [gen_s] * len(out)})

    def _responses(self, prompts: torch.Tensor, pmask: torch.Tensor, seed: int, greedy: bool) -> Batch:
        """One response per prompt [B, P]: `response_batch`'s tensors, and the engine's rollout_logprobs [B, R]."""
        responses = self.engine.generate(prompts, pmask, seed=seed, greedy=greedy).to(self.device)
        eos = None if self.spec.rollout.fixed_length else self.tokenizer.eos_token_id
        out = response_batch(prompts, pmask, responses, eos)
        engine_logprobs = self.engine.rollout_logprobs()
        if engine_logprobs is not None:
            # masked again: where vLLM ends a response (a stop token kept or not) is its own
            out.tensors["rollout_logprobs"] = engine_logprobs.to(self.device) * out["response_mask"]
        return out

    @register(Dispatch.SPLIT, repeatable=True)
    @torch.no_grad()
    def compute_logprobs(self, batch: Batch) -> Batch:
        """old_logprobs [B, R] of the trained model (spec.rollout.async: the proximal policy of decoupled PPO; the
        rollout's own log-probs are the behaviour policy's)."""
        return Batch({"old_logprobs": self._logprobs(batch, self.trainer.model).cpu()})

    @register(Dispatch.ALL, repeatable=True)
    def policy_weights(self) -> dict[str, torch.Tensor]:
        """The full (unsharded) policy weights on the CPU, for the rollout role (spec.rollout.async): gathering them
        takes every rank (a collective under FSDP); rank 0 returns them, the others nothing."""
        state = self.trainer.full_state_dict()
        # a copy even on the CPU: the rollout applies it later, when the live parameters may have moved on
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()} if self.rank == 0 else {}

    @register(Dispatch.SPLIT, repeatable=True)
    @torch.no_grad()
    def evaluate(self, batch: Batch) -> Batch:
        """Held-out prompts (kuberl.controller.evaluation) -> the engine's greedy answers: responses, response_mask [B,
        R] (up to EOS, whatever rollout.fixedLength says), input_ids, attention_mask [B, P+R]; CPU tensors."""
        prompts, pmask = batch["prompt_ids"], batch["prompt_mask"]
        responses = self.engine.greedy_answers(prompts, pmask).cpu()
        return response_batch(prompts.cpu(), pmask.cpu(), responses, self.tokenizer.eos_token_id)

    @register(Dispatch.SPLIT, repeatable=True)
    @torch.no_grad()
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        """ref_logprobs [B, R] of the base model: this actor's own weights with its LoRA adapters off, so a
        LoRA job needs no ref role and no second copy of the model (spec.roles.ref.enabled: false)."""
        with lora.adapters_off(self.trainer.model):
            return Batch({"ref_logprobs": self._logprobs(batch, self.trainer.model).cpu()})

    @torch.no_grad()
    def _logprobs(self, b: Batch, model: torch.nn.Module) -> torch.Tensor:
        """[B, R] under `model`, a micro-batch at a time. The engine's model (the behaviour policy of an asynchronous
        rollout, running beside an update) is not sharded: its rows are cut by microBatchSize, with no collective
        that could interleave with the update's, and run padded."""
        trained = model is self.trainer.model
        rows = self.micro_batches(b) if trained else micro_rows(b, self.spec.trainer.micro_batch_size)
        return map_rows(b, rows, lambda mb: self._logprobs_of(mb, model=model)[0])

    def _logprobs_of(self, mb: Batch, with_entropy: bool = False, entropy_grad: bool = False,
                     model: torch.nn.Module | None = None):
        """Packed (spec.trainer.packed) on the trained model only: the engine's own model (the behaviour policy
        of an asynchronous rollout) keeps its attention and takes the rows padded."""
        k, model = self.kernels, model or self.trainer.model
        packed = self.spec.trainer.packed and model is self.trainer.model
        return response_logprobs(model, mb["input_ids"], mb["attention_mask"], mb["responses"],
                                 self.spec.rollout.temperature, chunk_size=k.chunk_rows, with_entropy=with_entropy,
                                 entropy_grad=entropy_grad, fused=k.fused_head, compile=k.compile_head,
                                 response_mask=mb["response_mask"] if packed else None)

    @register(Dispatch.SPLIT, trains=True, repeatable=True)  # applied once per step (FSDPTrainer.fit)
    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """PPO epochs over the batch in mini-batches; returns token-averaged stats from all ranks."""
        spec, algo = self.spec, self.spec.algorithm
        policy_loss = algos.POLICY_LOSSES.get(algo.policy_loss)
        kl_coef = batch.meta.get("kl_coef", [0.0])[0]
        token_mean = algo.loss_aggregation == "token-mean"  # the weights are the mask's, scaled
        tis = spec.tis_enabled and "rollout_logprobs" in batch.tensors  # the policy loss's weights times TIS's

        def loss_fn(mb: Batch):
            # every term aggregated alike, under the trainer's weights (the policy loss gets them as its mask: a
            # weighted mean, times their sum); the stats are token sums, the same for any aggregation or ranks
            mask, n, w = mb["response_mask"], mb["response_mask"].sum(), mb["loss_weight"]
            logp, ent = self._logprobs_of(mb, with_entropy=True, entropy_grad=algo.entropy_coef > 0)
            pg, info = policy_loss(logp, mb["old_logprobs"], mb["advantages"], mask, algo)
            pw = w * algos.tis_weights(mb["old_logprobs"], mb["rollout_logprobs"], algo.tis_cap) if tis else w
            agg = pg if token_mean and not tis else policy_loss(logp, mb["old_logprobs"], mb["advantages"], pw, algo)[0]
            ent_sum = algos.masked_sum(ent, mask)
            loss = agg * pw.sum() - algo.entropy_coef * algos.masked_sum(ent, w)
            stats = {"pg_loss": pg.detach() * n, "clip_frac": info["clip_frac"] * n,
                     "approx_kl": info["approx_kl"] * n, "entropy": ent_sum.detach()}
            if not algo.kl_in_reward and kl_coef > 0 and "ref_logprobs" in mb.tensors:
                kl = algos.kl_penalty(logp, mb["ref_logprobs"], algo.kl.estimator)
                loss = loss + kl_coef * algos.masked_sum(kl, w)
                stats["kl_loss"] = algos.masked_sum(kl, mask).detach()
            return loss, stats

        stats = self.trainer.fit(batch, step, spec.trainer, loss_fn, algo.loss_aggregation)
        stats["actor_grad_norm"] = stats.pop("grad_norm")
        return stats

    def restored(self) -> None:
        self.sync_weights()

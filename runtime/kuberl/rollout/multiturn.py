"""Multi-turn rollout (spec.environment): the policy takes a turn, the environment answers, and the next turn
continues from the whole trajectory, up to maxTurns or until the environment says done.

Any `RolloutEngine` runs it through its `generate` (the engine is built with rollout.maxNewTokens set to
maxTokensPerTurn, `turn_spec`). Each `generate` takes, left-padded into one batch, every trajectory whose
environment has answered its last turn; its environments' `step` calls then run on a pool of `concurrency`
threads, each bounded by timeoutSeconds. The next `generate` waits for them a quarter of the last one's time
(`LINGER`) at most, and then goes ahead with those that answered: a slow environment holds up its own trajectory,
not the others' next turns (with fast environments every trajectory's turn k is in the same k-th `generate`). An
environment that raises, returns something unusable or times out fails its trajectory alone: it is kept in the
batch with its response mask all 0 (no gradient), its reward 0, and counted (`env_failed`); the others go on.

Observations are tokenized as they are given (the environment writes its own framing), without special tokens,
and are never trained on (`kuberl.envs.trajectory`). A first observation given as chat messages goes through the
tokenizer's chat template when it has one, else its contents are joined by newlines.

On vLLM the engine stays awake from the first turn to the last (`RolloutEngine.turns`), so each turn continues from
its prefix cache rather than a new prefill of the whole trajectory (the cache is emptied by weight syncs alone).

The environments are made by `make_env`: in this process, or (the env role, spec.roles.env) in the env role's
processes (`kuberl.envs.remote`), where a rank that dies fails its trajectories as any raising call does. After the
rollout `release` drops them (by default each one's own `close()`, where it has one).
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kuberl.data.batch import Batch
from kuberl.envs import EnvStepError, coerce_reset, coerce_step
from kuberl.envs.interface import Environment, Messages, close_all
from kuberl.envs.trajectory import Turn, build_trajectory, observation_turn, policy_turn, trajectory_batch
from kuberl.spec import JobSpec
from kuberl.spec.model import EnvironmentSpec

from . import RolloutEngine

POLL_S = 0.05  # how often the environment calls in flight are checked against timeoutSeconds
SPAN_GAP_S = 0.01  # the timeline's environment calls closer than this are one span (a step's chart shows seconds)
LINGER = 0.25  # after a turn is generated, how long its environment calls are awaited before the next generate
# goes ahead with those that answered, as a fraction of that generate's time (the others join a later one)


def turn_spec(spec: JobSpec) -> JobSpec:
    """The spec an engine of multi-turn rollout is built with: one `generate` is one turn, of at most
    maxTokensPerTurn tokens; the prompts it sees grow to the first observation plus the whole response."""
    env = spec.environment
    assert env is not None
    rollout = spec.rollout.model_copy(update={"max_new_tokens": env.max_tokens_per_turn})
    return spec.model_copy(update={"rollout": rollout})


@dataclass
class Episode:
    """One trajectory in the making: its environment, its prompt's tokens [P] and its turns so far."""

    env: Environment | None
    prompt: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    turns: list[Turn] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # one per policy turn answered
    tools: list[int] = field(default_factory=lambda: [0, 0])  # tool calls, tool errors (as steps' info report them)
    done: bool = False
    failure: str | None = None
    used: int = 0  # response tokens so far (policy and observations)

    def context(self) -> torch.Tensor:
        """[P + used] the prompt and every turn: what the policy's next turn continues."""
        return torch.cat([self.prompt, *(t.tokens for t in self.turns)])

    @property
    def going(self) -> bool:
        return not self.done and self.failure is None


def left_pad(rows: Sequence[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows of any lengths -> (ids [B, L], mask [B, L]) left-padded to the longest, L >= 1."""
    width = max(1, *(r.numel() for r in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r.numel():
            ids[i, width - r.numel():], mask[i, width - r.numel():] = r, 1
    return ids, mask


class Calls:
    """The environment calls in flight on a pool of `concurrency` threads, each given `timeout_s` from its own
    start. A call that raises, or does not return in time, fails its episode (named in `failure`); a call past its
    time is left running (a thread cannot be stopped), not waited for."""

    def __init__(self, pool: cf.Executor, timeout_s: float, where: str):
        self.pool, self.timeout_s, self.where = pool, timeout_s, where
        # a call in flight -> (its number, its episode, reset or step, whether it answers the episode's last turn,
        # [its start])
        self.pending: dict[cf.Future, tuple[int, Episode, str, bool, list[float]]] = {}
        self.submitted = 0
        self.waited_s = 0.0  # seconds `collect` waited: the rollout held up by its environments
        self.ended: list[tuple[str, float, float]] = []  # calls that returned or raised: (what, start, end) monotonic

    def submit(self, episode: Episode, fn: Callable[[Any], Any], arg: Any, what: str, last: bool = False) -> None:
        started: list[float] = []

        def timed() -> Any:
            started.append(time.monotonic())
            try:
                return fn(arg)
            finally:
                self.ended.append((what, started[0], time.monotonic()))

        self.pending[self.pool.submit(timed)] = (self.submitted, episode, what, last, started)
        self.submitted += 1

    def collect(self, linger_s: float) -> list[tuple[Episode, Any, bool]]:
        """Wait for the calls in flight, at most `linger_s` (and past it, until one has ended), and give the results
        of those that ended well, in the order they were submitted: (episode, what it returned, last)."""
        t0, deadline, ended = time.perf_counter(), time.monotonic() + linger_s, []
        while self.pending:
            cf.wait(self.pending, timeout=POLL_S, return_when=cf.FIRST_COMPLETED)
            now = time.monotonic()
            for future, (number, episode, what, last, started) in list(self.pending.items()):
                late = not future.done() and bool(started) and now - started[0] > self.timeout_s
                if future.done() or late:
                    del self.pending[future]
                    ended.append((number, future, episode, what, last, late))
            if ended and now >= deadline:
                break
        self.waited_s += time.perf_counter() - t0
        results = []
        for _, future, episode, what, last, late in sorted(ended, key=lambda e: e[0]):  # the next generate's rows
            if late:
                episode.failure = f"{self.where}.{what}() took longer than timeoutSeconds ({self.timeout_s} s)"
            elif future.exception() is not None:
                exc = future.exception()
                first = (str(exc).strip().splitlines() or [""])[0]
                episode.failure = f"{self.where}.{what}() raised {type(exc).__name__}: {first}"
            else:
                results.append((episode, future.result(), last))
        return results


class MultiTurnRollout:
    """Runs trajectories of spec.environment on an engine (the module's docstring). `make_env` makes one
    environment per trajectory, `release` drops a rollout's environments after it (default: `close_all`), and
    `concurrency` calls run at once (default spec.environment.concurrency); the returned Batch is
    `kuberl.envs.trajectory.trajectory_batch`'s plus env_rewards [B, R] (each policy turn's reward on its last
    token) and meta env_turns, env_failure."""

    def __init__(self, spec: JobSpec, engine: RolloutEngine, tokenizer: Any, make_env: Callable[[], Environment],
                 release: Callable[[list[Environment]], None] | None = None, concurrency: int | None = None):
        assert spec.environment is not None
        self.env: EnvironmentSpec = spec.environment
        self.engine, self.tok, self.make_env = engine, tokenizer, make_env
        self.where = self.env.where
        self.release = release or (lambda envs: close_all(envs, self.where))
        self.concurrency = concurrency or self.env.concurrency
        self.width, self.max_prompt = spec.rollout.max_new_tokens, spec.data.max_prompt_length
        self.eos = None if spec.rollout.fixed_length else tokenizer.eos_token_id
        self.env_s = 0.0  # the last run's seconds waiting for environment calls
        self.env_spans: list[tuple[str, float, float]] = []  # the last run's `busy_spans`

    def run(self, rows: Sequence[dict[str, Any]], seed: int, device: torch.device | str = "cpu") -> Batch:
        """Data rows (one per trajectory) -> the trajectories' Batch (the class docstring), on the CPU. A turn is
        generated for every trajectory whose environment has answered; the environment calls of the others go on
        meanwhile (`Calls.collect`)."""
        pool, self.env_s = cf.ThreadPoolExecutor(self.concurrency, thread_name_prefix="env"), 0.0
        calls, t0, episodes = Calls(pool, self.env.timeout_seconds, self.where), time.monotonic(), []
        try:
            episodes = self._start(calls, rows)
            with self.engine.turns():  # vllm: awake from the first turn to the last
                self._play(calls, [e for e in episodes if e.going and e.used < self.width], seed, device)
        finally:
            self.env_s, self.env_spans = calls.waited_s, busy_spans(list(calls.ended), t0)
            pool.shutdown(wait=False, cancel_futures=True)  # a hung environment call is left behind, not awaited
            self.release([e.env for e in episodes if e.env is not None])
        return self._batch(episodes)

    def _play(self, calls: Calls, ready: list[Episode], seed: int, device: torch.device | str) -> None:
        """Turns until every episode is done or failed: a generate for those `ready`, then their steps."""
        generated = 0
        while ready or calls.pending:
            if ready:
                t0 = time.perf_counter()
                self._policy_turn(ready, seed + 7919 * generated, device)
                generated, linger = generated + 1, LINGER * (time.perf_counter() - t0)
                for e in ready:
                    calls.submit(e, e.env.step, self.tok.decode(e.turns[-1].tokens, skip_special_tokens=True),
                                 "step", last=len(e.rewards) + 1 >= self.env.max_turns)
            else:
                linger = 0.0
            ready = [e for e, value, last in calls.collect(linger) if self._answered(e, value, last)]

    def _start(self, calls: Calls, rows: Sequence[dict[str, Any]]) -> list[Episode]:
        """A new environment per row, reset on it: the prompt is its first observation."""
        episodes = []
        for row in rows:
            try:
                episodes.append(Episode(self.make_env()))
            except Exception as exc:  # the user's constructor
                episodes.append(Episode(None, failure=f"{self.where}() raised {type(exc).__name__}: {exc}"))
                continue
            calls.submit(episodes[-1], episodes[-1].env.reset, row, "reset")
        for episode, first, _ in calls.collect(float("inf")):
            try:
                episode.prompt = self._encode_first(coerce_reset(first, self.where))
            except EnvStepError as exc:
                episode.failure = str(exc)
        return episodes

    def _policy_turn(self, going: list[Episode], seed: int, device: torch.device | str) -> None:
        """One generate over the trajectories `going`; each gets its turn, cut at EOS or maxTokensPerTurn and
        at the room left in the response."""
        ids, mask = left_pad([e.context() for e in going], self.tok.pad_token_id)
        out = self.engine.generate(ids.to(device), mask.to(device), seed=seed).cpu()
        logp = self.engine.rollout_logprobs()
        logp = torch.zeros(out.shape) if logp is None else logp.float().cpu()
        for i, e in enumerate(going):
            turn = policy_turn(out[i], logp[i], self.eos, min(self.env.max_tokens_per_turn, self.width - e.used))
            e.turns.append(turn)
            e.used += turn.tokens.numel()

    def _answered(self, episode: Episode, value: Any, last: bool) -> bool:
        """The environment's step on the episode's last turn (`value`, as `step` returned it): its reward, and its
        observation joining the trajectory unless it is done (`last`: its maxTurns-th turn). Whether it goes on."""
        try:
            step = coerce_step(value, self.where)
        except EnvStepError as exc:
            episode.failure = str(exc)
            return False
        episode.rewards.append(step.reward)
        episode.tools = [episode.tools[0] + count(step.info, "tool_calls"),
                         episode.tools[1] + count(step.info, "tool_errors")]
        episode.done = step.done or last or episode.used >= self.width
        if not episode.done and step.observation:
            obs = torch.tensor(self.tok(step.observation, add_special_tokens=False)["input_ids"], dtype=torch.long)
            obs = obs[: self.width - episode.used]
            episode.turns.append(observation_turn(obs))
            episode.used += obs.numel()
        return episode.going and episode.used < self.width

    def _encode_first(self, first: str | Messages) -> torch.Tensor:
        """The first observation -> prompt tokens [P], its last maxPromptLength kept (as prompts are cut)."""
        if isinstance(first, str):
            ids = self.tok(first)["input_ids"]
        elif getattr(self.tok, "chat_template", None):
            ids = self.tok.apply_chat_template(first, add_generation_prompt=True, tokenize=True)
        else:
            ids = self.tok("\n".join(m["content"] for m in first))["input_ids"]
        ids = torch.as_tensor(ids, dtype=torch.long).flatten()[-self.max_prompt:]
        return ids if ids.numel() else torch.tensor([self.tok.pad_token_id])

    def _batch(self, episodes: list[Episode]) -> Batch:
        """The episodes' tensors; a failed one trains on nothing and scores 0."""
        pad = self.tok.pad_token_id
        trajectories = [build_trajectory(e.prompt if e.prompt.numel() else torch.tensor([pad]),  # a row needs a token
                                         e.turns if e.failure is None else [], self.width, pad) for e in episodes]
        # every rank's prompts as wide, so that the ranks' batches stack on the driver
        out = trajectory_batch(trajectories, pad, self.max_prompt)
        rewards = torch.zeros(len(episodes), self.width)
        for row, (e, t) in enumerate(zip(episodes, trajectories)):
            if e.failure is None:
                for end, reward in zip(t.turn_ends, e.rewards):
                    rewards[row, end] += reward
        out.tensors["env_rewards"] = rewards
        out.meta.update(env_turns=[len(e.rewards) for e in episodes], env_failure=[e.failure for e in episodes],
                        env_tools=[tuple(e.tools) for e in episodes], env_seconds=[self.env_s] * len(episodes),
                        env_spans=[self.env_spans] + [[]] * (len(episodes) - 1))  # once per rank: its first row
        return out


def busy_spans(calls: Sequence[tuple[str, float, float]], t0: float,
               gap_s: float = SPAN_GAP_S) -> list[tuple[str, float, float]]:
    """Environment calls (what, start, end; monotonic s) -> when calls of each kind ran: ("env_reset" or "env_step",
    start, end) in seconds from `t0`, calls of a kind that overlap or are less than `gap_s` apart in one span."""
    out: list[tuple[str, float, float]] = []
    for what in dict.fromkeys(w for w, _, _ in calls):
        merged: list[list[float]] = []
        for _, start, end in sorted(c for c in calls if c[0] == what):
            if merged and start <= merged[-1][1] + gap_s:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        out += [(f"env_{what}", start - t0, end - t0) for start, end in merged]
    return out


def batch_env_spans(batch: Batch) -> list[tuple[str, float, float]]:
    """Every rank's `busy_spans` of a multi-turn batch (none for a single-turn one)."""
    return [tuple(span) for row in batch.meta.get("env_spans", []) for span in row]


def count(info: dict[str, Any], key: str) -> int:
    """A step's count under `key` in its info (the tool environment's tool_calls, tool_errors), 0 when absent."""
    value = info.get(key, 0)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def episode_stats(batch: Batch) -> dict[str, float]:
    """A multi-turn batch's figures for the step's metrics: env_failed (trajectories), env_turns_mean (policy turns
    answered, of those that did not fail), env_reward_mean (the environment's part of the reward, per
    trajectory), env_truncated (trajectories cut at rollout.maxNewTokens), env_tool_calls and env_tool_errors (of
    all trajectories, as their steps' info counted them) and env_seconds (the longest time a rank waited for its
    environments' calls, s)."""
    failed = [f is not None for f in batch.meta["env_failure"]]
    turns = [t for t, bad in zip(batch.meta["env_turns"], failed) if not bad]
    tools = batch.meta["env_tools"]
    return {"env_failed": float(sum(failed)), "env_turns_mean": sum(turns) / len(turns) if turns else 0.0,
            "env_reward_mean": float(batch["env_rewards"].sum(-1).mean()),
            "env_truncated": float(sum(batch.meta["truncated"])),
            "env_tool_calls": float(sum(t[0] for t in tools)), "env_tool_errors": float(sum(t[1] for t in tools)),
            "env_seconds": max(batch.meta["env_seconds"])}

"""The env role (spec.roles.env) in-process: the spec's rules for it, and the multi-turn rollout reaching its
workers through `kuberl.envs.remote` the way the actor does, with the same trajectories as environments in the
actor's own process. Its Ray side (processes, a rank that dies, restarts) is tests/integration/test_agent.py's."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest
import torch

from kuberl.envs import EnvStep
from kuberl.envs.remote import EnvEndpoints
from kuberl.resilience.resize import request_problem, resized
from kuberl.rollout.hf import HFRollout
from kuberl.rollout.multiturn import MultiTurnRollout, turn_spec
from kuberl.spec import JobSpec, enabled_roles
from kuberl.spec.model import cross_field_problems
from kuberl.training.models import char_tokenizer
from kuberl.workers import EnvWorker
from kuberl.workers.env import EnvHealth, stuck_problem

MODULE = __name__


class Counter:
    """Two turns: the second observation names the first action's length; closes are counted (per process)."""

    closed = 0

    def reset(self, row: dict[str, Any]) -> str:
        if row.get("mode") == "raises":
            raise RuntimeError("level missing")
        self.turns = 0
        return row["prompt"]

    def step(self, action_text: str) -> EnvStep:
        self.turns += 1
        return EnvStep(f" len {len(action_text)}:", float(len(action_text) % 3), self.turns >= 2, {})

    def close(self) -> None:
        Counter.closed += 1


def job(environment_fields: dict[str, Any] | None = None, **roles: Any) -> JobSpec:
    environment = {"module": MODULE, "class": "Counter", "maxTurns": 2, "maxTokensPerTurn": 6, "concurrency": 2}
    return JobSpec.model_validate({
        "model": {"builtin": "tiny"}, "algorithm": {"name": "grpo", "groupSize": 2},
        "data": {"task": "repeat-letter", "maxPromptLength": 8},
        "reward": {"function": "environment" if environment_fields is not None else "repeat-letter"},
        "rollout": {"maxNewTokens": 24, "temperature": 1.0}, "roles": roles,
        **({"environment": environment | environment_fields} if environment_fields is not None else {})})


def rows(n: int, mode: str = "ok") -> list[dict[str, Any]]:
    return [{"prompt": f"say {chr(97 + i)}:", "mode": mode} for i in range(n)]


def test_the_env_role_runs_with_an_environment_only_unless_turned_off() -> None:
    assert "env" in enabled_roles(job({}))
    assert "env" not in enabled_roles(job())
    assert "env" not in enabled_roles(job({}, env={"enabled": False}))
    assert cross_field_problems(job({}, env={"replicas": 3})) == []


def test_an_env_role_with_gpus_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"roles.env.gpus: is 1, but the environment workers run on CPU"):
        job({}, env={"gpus": 1})


def test_the_env_role_can_be_resized_live() -> None:
    assert request_problem("env", 3) is None and resized(job({}), "env", 3).roles.env.replicas == 3


@pytest.fixture
def engine_for():
    tok = char_tokenizer()

    def make(spec: JobSpec) -> HFRollout:
        return HFRollout(turn_spec(spec), torch.device("cpu"), torch.float32, tok, fast=False)
    return make


def env_workers(spec: JobSpec, n: int) -> list[EnvWorker]:
    workers = []
    for rank in range(n):
        w = EnvWorker(spec.model_dump_json(by_alias=True), "env", rank, n, "cpu")
        w.setup()
        workers.append(w)
    return workers


def test_trajectories_through_env_workers_are_those_of_environments_in_the_actors_process(engine_for) -> None:
    spec, tok = job({}, env={"replicas": 2}), char_tokenizer()
    here = MultiTurnRollout(spec, engine_for(spec), tok, Counter).run(rows(4), seed=5)
    workers = env_workers(spec, 2)
    endpoints = EnvEndpoints(workers, 0, spec.environment.timeout_seconds, spec.environment.concurrency)
    Counter.closed = 0
    apart = MultiTurnRollout(spec, engine_for(spec), tok, endpoints.make, endpoints.release,
                             endpoints.concurrency).run(rows(4), seed=5)
    assert torch.equal(here["responses"], apart["responses"])
    assert torch.equal(here["response_mask"], apart["response_mask"])
    assert torch.equal(here["env_rewards"], apart["env_rewards"])
    assert apart.meta["env_turns"] == [2, 2, 2, 2] and apart.meta["env_failure"] == [None] * 4
    # round robin over the two ranks; every environment dropped (and closed) after the rollout
    assert Counter.closed == 4 and [w.env_health().open for w in workers] == [0, 0]
    assert endpoints.concurrency == 4


def test_an_environment_raising_in_an_env_worker_fails_its_trajectory_alone(engine_for) -> None:
    spec, tok = job({}), char_tokenizer()
    (worker,) = env_workers(spec, 1)
    endpoints = EnvEndpoints([worker], 0, 5.0, 2)
    out = MultiTurnRollout(spec, engine_for(spec), tok, endpoints.make, endpoints.release,
                           endpoints.concurrency).run(rows(1, "raises") + rows(1), seed=1)
    failure, ok = out.meta["env_failure"]
    assert failure == f"{MODULE}.Counter.reset() raised RuntimeError: level missing" and ok is None
    assert out["response_mask"][0].sum() == 0 and out["response_mask"][1].sum() > 0
    assert worker.env_health() == EnvHealth(0, ())


def test_a_step_of_the_wrong_shape_is_named_in_the_env_worker() -> None:
    spec = job({})
    (worker,) = env_workers(spec, 1)
    worker.env_reset("k", rows(1)[0])
    worker.open["k"].step = lambda text: 42  # what a user's step might return
    with pytest.raises(ValueError, match=r"spec.environment.class .*Counter: step\(\) returned an int"):
        worker.env_step("k", "x")


def test_a_hung_call_is_counted_stuck_once_the_actor_stopped_waiting(monkeypatch) -> None:
    """A step that never returns keeps its thread: once it has run past timeoutSeconds + the actor's margin (here
    0), the step-end check counts it, and a rank whose stuck calls hold half its slots is to be restarted."""
    monkeypatch.setattr("kuberl.workers.env.CALL_MARGIN_S", 0.0)
    spec = job({"timeoutSeconds": 2})
    (worker,) = env_workers(spec, 1)
    worker.env_reset("k", rows(1)[0])
    release, started = threading.Event(), threading.Event()
    worker.open["k"].step = lambda text: started.set() or release.wait() and EnvStep("", 0.0, True, {})
    hung = threading.Thread(target=worker.env_step, args=("k", "x"))
    t0 = time.monotonic()
    hung.start()
    try:
        started.wait()
        if time.monotonic() - t0 < 1.5:
            assert worker.env_health() == EnvHealth(1, ())  # running, not yet past its timeout
        time.sleep(max(0.0, 2.2 - (time.monotonic() - t0)))
        health = worker.env_health()
        assert health.open == 1 and len(health.stuck) == 1 and health.stuck[0] >= 2
        assert stuck_problem([EnvHealth(0, ()), health], 3, 2) is None  # 1 of 3 slots: the rank serves on
        detail, oldest_s = stuck_problem([EnvHealth(0, ()), health], 2, 2)
        assert detail.startswith("env rank 1: 1 of its 2 environment call slots held by calls running past "
                                 "timeoutSeconds (2s)") and oldest_s == health.stuck[0]
    finally:
        release.set()
        hung.join()
    assert worker.env_health() == EnvHealth(1, ())  # the call ended: nothing stuck


assert sys.modules[MODULE].Counter is Counter  # the env workers import this module by its name

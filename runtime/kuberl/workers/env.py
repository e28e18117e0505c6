"""Env role (spec.roles.env): the environments of spec.environment in processes of their own, apart from the actor.

Each rank holds the environments of the trajectories routed to it, one per trajectory, by key. The actor's
multi-turn rollout reaches them through `kuberl.envs.remote` (its `EnvEndpoints`), calling `env_reset`, `env_step`
and `env_close` directly, up to spec.environment.concurrency at once per rank (the Ray actor's threads), not
through the driver. The driver's only call is `open_environments`, once a step (`kuberl.controller.roles.Roles`):
the role's liveness check, and where an injected fault hits it. A rank that dies takes its trajectories' calls
with it (each fails its trajectory on the actor's side); the supervisor restarts this role alone and hands the
actor the new ranks. The environments hold user code and no state worth keeping past a rollout: nothing is
restored.
"""

from __future__ import annotations

import threading
from typing import Any

from kuberl.envs import environment_factory
from kuberl.envs.interface import Environment, EnvStep, Messages, close_all, coerce_step
from kuberl.workers.dispatch import Dispatch, register

from .base import Worker


class EnvWorker(Worker):
    def setup(self) -> None:
        assert self.spec.environment is not None, "the env role runs only with spec.environment"
        self.env_spec = self.spec.environment
        self.where = self.env_spec.where
        self.make = environment_factory(self.env_spec, prompt_key=self.spec.data.prompt_key)  # imported once, here
        self.open: dict[str, Environment] = {}  # trajectory key -> its environment, from reset to close
        self.lock = threading.Lock()

    def env_reset(self, key: str, row: dict[str, Any]) -> str | Messages:
        """A new environment for trajectory `key`, reset on its data row: the first observation (as `reset` gave
        it; the actor checks it)."""
        env = self.make()
        with self.lock:
            self.open[key] = env
        return env.reset(row)

    def env_step(self, key: str, action_text: str) -> EnvStep:
        """Trajectory `key`'s environment answers one policy turn; checked here, so that what crosses the process
        boundary is an EnvStep (a wrong shape raises EnvStepError naming spec.environment.class)."""
        with self.lock:
            env = self.open[key]
        return coerce_step(env.step(action_text), self.where)

    def env_close(self, keys: list[str]) -> None:
        """The trajectories `keys` are over: their environments are dropped (a `close()` of their own is called)."""
        with self.lock:
            gone = [self.open.pop(k) for k in keys if k in self.open]
        close_all(gone, self.where)

    @register(Dispatch.ALL, state=False, repeatable=True)
    def open_environments(self) -> int:
        """The environments this rank holds now (0 between rollouts: none leaked)."""
        with self.lock:
            return len(self.open)

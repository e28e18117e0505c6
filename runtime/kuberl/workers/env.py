"""Env role (spec.roles.env): the environments of spec.environment in processes of their own, apart from the actor.

Each rank holds the environments of the trajectories routed to it, one per trajectory, by key. The actor's
multi-turn rollout reaches them through `kuberl.envs.remote` (its `EnvEndpoints`), calling `env_reset`, `env_step`
and `env_close` directly, up to spec.environment.concurrency at once per rank (the Ray actor's threads), not
through the driver. The driver's only call is `env_health`, once a step (`kuberl.controller.roles.Roles`):
the role's liveness check, and where an injected fault hits it. A rank that dies takes its trajectories' calls
with it (each fails its trajectory on the actor's side); the supervisor restarts this role alone and hands the
actor the new ranks. A call that hangs fails its trajectory on the actor's side after timeoutSeconds, but its
thread here cannot be stopped: it holds one of the rank's `concurrency` slots until the process ends. The health
check counts such calls once the actor has stopped waiting for them too (timeoutSeconds + CALL_MARGIN_S), and a rank
whose stuck calls hold half its slots or more is restarted like a dead one (`stuck_problem`); like any role's
failure, that counts against spec.roles.env.maxRestarts. The environments hold user code and no state worth keeping
past a rollout: nothing is restored.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any

from kuberl.envs import environment_factory
from kuberl.envs.interface import Environment, EnvStep, Messages, close_all, coerce_step
from kuberl.envs.remote import CALL_MARGIN_S
from kuberl.workers.dispatch import Dispatch, register

from .base import Worker


@dataclass(frozen=True)
class EnvHealth:
    """One env rank's answer to the driver's step-end check."""

    open: int  # environments held (0 between rollouts: none leaked)
    # seconds each call still running past timeoutSeconds + CALL_MARGIN_S has run, oldest first
    stuck: tuple[float, ...]


def stuck_problem(health: list[EnvHealth], concurrency: int, timeout_s: float) -> tuple[str, float] | None:
    """Why the env role must restart, and the age in seconds of the named rank's oldest stuck call; or None. A rank
    whose stuck calls (`EnvHealth.stuck`) hold at least half of its `concurrency` slots (at least one) serves the
    rest of its trajectories late or not at all, and only ending its process frees them."""
    for rank, h in enumerate(health):
        if h.stuck and 2 * len(h.stuck) >= concurrency:
            ages = ", ".join(f"{s:.0f}s" for s in h.stuck[:4]) + (" ..." if len(h.stuck) > 4 else "")
            return (f"env rank {rank}: {len(h.stuck)} of its {concurrency} environment call slots held by calls "
                    f"running past timeoutSeconds ({timeout_s:g}s): {ages}; a hung environment call is only freed "
                    f"by restarting its process"), h.stuck[0]
    return None


class EnvWorker(Worker):
    def setup(self) -> None:
        assert self.spec.environment is not None, "the env role runs only with spec.environment"
        self.env_spec = self.spec.environment
        self.where = self.env_spec.where
        self.make = environment_factory(self.env_spec, prompt_key=self.spec.data.prompt_key)  # imported once, here
        self.open: dict[str, Environment] = {}  # trajectory key -> its environment, from reset to close
        self.running: dict[int, float] = {}  # the environment calls in progress: call number -> its start (monotonic)
        self.calls = itertools.count()
        self.lock = threading.Lock()

    def env_reset(self, key: str, row: dict[str, Any]) -> str | Messages:
        """A new environment for trajectory `key`, reset on its data row: the first observation (as `reset` gave
        it; the actor checks it)."""
        env = self._timed(self.make)
        with self.lock:
            self.open[key] = env
        return self._timed(env.reset, row)

    def env_step(self, key: str, action_text: str) -> EnvStep:
        """Trajectory `key`'s environment answers one policy turn; checked here, so that what crosses the process
        boundary is an EnvStep (a wrong shape raises EnvStepError naming spec.environment.class)."""
        with self.lock:
            env = self.open[key]
        return coerce_step(self._timed(env.step, action_text), self.where)

    def _timed(self, call: Any, *args: Any) -> Any:
        """`call(*args)` (the user's code: its class, reset, step or close), in `running` while it runs (what
        `env_health` counts as stuck)."""
        with self.lock:
            n = next(self.calls)
            self.running[n] = time.monotonic()
        try:
            return call(*args)
        finally:
            with self.lock:
                del self.running[n]

    def env_close(self, keys: list[str]) -> None:
        """The trajectories `keys` are over: their environments are dropped (a `close()` of their own is called)."""
        with self.lock:
            gone = [self.open.pop(k) for k in keys if k in self.open]
        self._timed(close_all, gone, self.where)

    @register(Dispatch.ALL, state=False, repeatable=True)
    def env_health(self) -> EnvHealth:
        """The environments this rank holds now, and its calls stuck: running for longer than the actor waits for
        them (timeoutSeconds + CALL_MARGIN_S), so their trajectories have failed and their threads are lost."""
        now, limit = time.monotonic(), self.env_spec.timeout_seconds + CALL_MARGIN_S
        with self.lock:
            ages = sorted((now - t for t in self.running.values()), reverse=True)
            return EnvHealth(len(self.open), tuple(a for a in ages if a > limit))

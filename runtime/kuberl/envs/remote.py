"""The actor's side of the env role (spec.roles.env): environments that live in the env role's processes.

`EnvEndpoints` holds the role's ranks as the actor reaches them (Ray actor handles, or the in-process workers of
the local backend) and makes `RemoteEnvironment`s, each a trajectory's environment on one rank (round robin), with
the `reset`/`step` of `kuberl.envs.interface`. The multi-turn rollout (`kuberl.rollout.multiturn`) uses them as it
uses environments in its own process: a call that raises fails its trajectory alone. A rank that died raises
`EnvWorkerDied` for each of its trajectories' calls; the driver's supervisor restarts the role and the actor gets
the new ranks (`ActorWorker.connect_env`). The worker side is `kuberl.workers.env.EnvWorker`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from .interface import EnvStep, Messages

CALL_MARGIN_S = 5.0  # a remote call is abandoned this long after timeoutSeconds (the rollout has failed it by then)


class EnvWorkerDied(RuntimeError):
    """The env role's rank holding a trajectory's environment died or cannot be reached."""


class EnvEndpoints:
    """The env role's `ranks` (Ray actor handles, or in-process EnvWorkers) for actor rank `rank`: environments
    made round robin over them, each Ray call waited for `timeout_s` + CALL_MARGIN_S at most (an in-process call runs
    in the rollout's thread, which the rollout stops waiting for after timeoutSeconds); `concurrency` calls at once
    in all (each rank's spec.environment.concurrency)."""

    def __init__(self, ranks: Sequence[Any], rank: int, timeout_s: float, per_rank_concurrency: int):
        if not ranks:
            raise ValueError("the env role has no ranks to hold environments")
        self.ranks, self.timeout_s = list(ranks), timeout_s
        self.concurrency = per_rank_concurrency * len(self.ranks)
        self._keys = itertools.count()
        self._rank = rank

    def make(self) -> RemoteEnvironment:
        """A new trajectory's environment, on the next rank in turn (not yet reset)."""
        n = next(self._keys)
        return RemoteEnvironment(self, (self._rank + n) % len(self.ranks), f"{self._rank}.{n}")

    def release(self, envs: Sequence[Any]) -> None:
        """The rollout is over: its environments are dropped on their ranks (one call per rank, not awaited)."""
        keys: dict[int, list[str]] = {}
        for env in envs:
            if isinstance(env, RemoteEnvironment):
                keys.setdefault(env.at, []).append(env.key)
        for at, batch in keys.items():
            self._send(at, "env_close", batch)  # a dead rank's environments died with it

    def call(self, at: int, method: str, *args: Any) -> Any:
        """`method` of rank `at`'s EnvWorker, waited for; its own exception raised as it is, a dead or unreachable
        rank as EnvWorkerDied."""
        fn = getattr(self.ranks[at], method)
        if not hasattr(fn, "remote"):  # an in-process worker (the local backend)
            return fn(*args)
        import ray

        try:
            return ray.get(fn.remote(*args), timeout=self.timeout_s + CALL_MARGIN_S)
        except ray.exceptions.RayTaskError as exc:  # the environment's own error, as the user's code raised it
            raise (exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc) from None
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"env rank {at} did not answer within {self.timeout_s + CALL_MARGIN_S:.0f}s") from None
        except ray.exceptions.RayError as exc:  # the rank's process died, or its node is gone
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise EnvWorkerDied(f"env rank {at} is gone ({type(exc).__name__}: {first})") from None

    def _send(self, at: int, method: str, *args: Any) -> None:
        """`method` of rank `at`, not waited for (in-process: run now)."""
        fn = getattr(self.ranks[at], method)
        if hasattr(fn, "remote"):
            fn.remote(*args)
        else:
            fn(*args)


class RemoteEnvironment:
    """One trajectory's environment, held by env rank `at` under `key` (kuberl.envs.interface's reset and step)."""

    def __init__(self, endpoints: EnvEndpoints, at: int, key: str):
        self.endpoints, self.at, self.key = endpoints, at, key

    def reset(self, row: dict[str, Any]) -> str | Messages:
        return self.endpoints.call(self.at, "env_reset", self.key, row)

    def step(self, action_text: str) -> EnvStep:
        return self.endpoints.call(self.at, "env_step", self.key, action_text)

"""Typed role proxies: `actor.generate(prompts, seed=...) -> Batch` instead of a method name and a rank index.

A proxy class lists the worker methods a program may call, each as `remote(WorkerClass.method)` (or
`remote_all(...)` for a `Dispatch.ALL` method, whose result is the per-rank list), so an IDE goes
from the call site to the worker method. How a call is spread over ranks and gathered is the
method's own `@register(Dispatch...)`. Every method has a blocking form and a non-blocking one:

    batch = actor.generate(prompts, seed=1)              # waits
    pending = actor.generate.submit(prompts, seed=1)     # RoleFuture[Batch], returns at once
    values = critic.compute_values(batch)                # other roles run meanwhile
    batch = pending.result()

A proxy built with a `Supervisor` (the driver's, or `kuberl.library.Roles`) recovers a failed role
when a future is waited on: the supervisor restarts only that role, and the future sends the same
call again (to the new ranks) and waits for that instead; a call that was in flight to the same
failed group replays without a second restart. A replay that fails with the same exception as the
failure before it (same call, same "Type: message") is deterministic: it raises `RoleError` (the job
fails with that error) instead of restarting the role again. A call that changes nothing when run twice
(`@register(repeatable=True)`: a read, a seeded computation) whose connection to a live rank broke is sent
again once, to the same ranks, without a restart. A completed update (`@register(trains=True)`)
is handed to the supervisor, which keeps the last one per role.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from kuberl import logs
from kuberl.workers import ActorWorker, CriticWorker, EnvWorker, RefWorker, RewardWorker, RolloutWorker, Worker
from kuberl.workers.dispatch import Dispatch, method_info
from kuberl.workers.groups import GroupCall, LinkBroken, RoleError, WorkerFailure, WorkerGroup

P = ParamSpec("P")
R = TypeVar("R")
log = logs.get("resilience")
R_co = TypeVar("R_co", covariant=True)


class Supervisor(Protocol):
    """What a proxy asks of whoever keeps its role alive (see `kuberl.library.Roles`)."""

    def fault_for(self, role: str, fn: Callable[..., Any]) -> str | None:
        """An injected fault ("kill", "hang") for this call, or None."""

    def current_phase(self) -> str:
        """The phase the program is in (recorded with a recovery)."""

    def recover(self, failure: WorkerFailure, phase: str, detect_s: float, in_flight: list[str]) -> Any:
        """Restart `failure.role` alone and restore its state; returns the recovery's record (with a
        `replay_s` the future fills in), or raises when the role's restart budget is spent. `phase`: the call
        that noticed the failure; `in_flight`: the phases of every call to the role then in flight, its own too."""

    def updated(self, role: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A `trains` call (an update) of `role` completed: kept, to run again on restored state whose
        snapshot of that update was not yet whole."""


_FLYING: weakref.WeakKeyDictionary[WorkerGroup, set[RoleFuture[Any]]] = weakref.WeakKeyDictionary()  # group ->
# its calls sent and not yet collected


class RoleFuture(Generic[R_co]):
    """A call in flight on every rank of one role. `result()` waits; a role failure seen while
    waiting is recovered by the proxy's supervisor and the call replayed, for this call only."""

    def __init__(self, proxy: RoleProxy, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]):
        self.proxy, self.fn, self.args, self.kwargs = proxy, fn, args, kwargs
        sup = proxy.supervisor
        self.phase = sup.current_phase() if sup is not None else ""
        self.recoveries: list[Any] = []  # the recoveries this call went through
        self._send()

    def _send(self) -> None:
        sup = self.proxy.supervisor
        fault = sup.fault_for(self.proxy.role, self.fn) if sup is not None and method_info(self.fn).faults else None
        self.sent_at = time.perf_counter()
        self._call: GroupCall = self.proxy.group.submit(self.fn, self.args, self.kwargs, fault)
        _FLYING.setdefault(self.proxy.group, set()).add(self)

    def _in_flight(self) -> list[str]:
        """The phases of the calls to this role's group (through any proxy) sent to this call's generation and not
        yet collected: when two are in flight, either may be the one that notices the failure."""
        calls = _FLYING.get(self.proxy.group, set())
        return sorted({f.phase or "no phase" for f in calls if f._call.generation == self._call.generation})

    def done(self) -> bool:
        """Whether the result is there (a failed call counts as done: `result()` then recovers)."""
        return self.proxy.group.done(self._call)

    def result(self) -> R_co:
        sup, group = self.proxy.supervisor, self.proxy.group
        last_error = ""  # the exception of this call's previous failure, if it raised one
        resent = False  # sent again after its link broke (once per call)
        while True:
            try:
                out = group.collect(self._call)
            except WorkerFailure as failure:
                if isinstance(failure, LinkBroken) and method_info(self.fn).repeatable and not resent:
                    log.info(f"role {failure.role}: the connection broke during {self.fn.__name__} and every rank is "
                             f"alive; it changes nothing when run twice, so it is sent again",
                             extra={"role": failure.role})
                    resent = True
                    self._send()
                    continue
                if sup is None:
                    raise
                if failure.error and failure.error == last_error:
                    raise RoleError(failure.role, f"{failure.error} (the same error twice in a row at "
                                                  f"{self.fn.__qualname__}: not restarted again)") from None
                last_error = failure.error
                if group.generation == self._call.generation:  # not yet restarted by another call's wait
                    self.recoveries.append(sup.recover(failure, self.phase, time.perf_counter() - self.sent_at,
                                                       self._in_flight()))
                _FLYING.get(group, set()).discard(self)
                self._send()  # the replay
                continue
            _FLYING.get(group, set()).discard(self)
            if self.recoveries:
                self.recoveries[-1].replay_s = time.perf_counter() - self.sent_at
            if sup is not None and method_info(self.fn).trains:
                sup.updated(self.proxy.role, self.fn, self.args, self.kwargs)
            return out


class BoundRemote(Generic[P, R]):
    """A worker method bound to a role proxy: call it to wait for the result, `submit` for a future."""

    def __init__(self, proxy: RoleProxy, fn: Callable[..., Any]):
        self.proxy, self.fn = proxy, fn

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.submit(*args, **kwargs).result()

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> RoleFuture[R]:
        return RoleFuture(self.proxy, self.fn, args, kwargs)


class RemoteMethod(Generic[P, R]):
    """Class attribute of a proxy naming one worker method (see `remote`, `remote_all`)."""

    def __init__(self, fn: Callable[..., Any]):
        method_info(fn)  # a declared role method
        self.fn = fn

    @overload
    def __get__(self, proxy: None, owner: type) -> RemoteMethod[P, R]: ...

    @overload
    def __get__(self, proxy: RoleProxy, owner: type) -> BoundRemote[P, R]: ...

    def __get__(self, proxy, owner):
        return self if proxy is None else BoundRemote(proxy, self.fn)


def remote(fn: Callable[Concatenate[Any, P], R]) -> RemoteMethod[P, R]:
    """A `Dispatch.SPLIT` or `Dispatch.ONE` worker method, called with the worker's own signature."""
    if method_info(fn).dispatch is Dispatch.ALL:
        raise TypeError(f"{fn.__qualname__} is Dispatch.ALL: name it with remote_all (its result is per rank)")
    return RemoteMethod(fn)


def remote_all(fn: Callable[Concatenate[Any, P], R]) -> RemoteMethod[P, list[R]]:
    """A `Dispatch.ALL` worker method: its result is the list of per-rank results."""
    if method_info(fn).dispatch is not Dispatch.ALL:
        raise TypeError(f"{fn.__qualname__} is not Dispatch.ALL: name it with remote")
    return RemoteMethod(fn)


class RoleProxy:
    """One role's WorkerGroup as typed methods. Subclass it to name a role's own methods."""

    identity = remote_all(Worker.identity)
    placement_info = remote_all(Worker.placement_info)
    memory = remote(Worker.memory)
    num_params = remote(Worker.num_params)
    measure_peak_flops = remote(Worker.measure_peak_flops)
    save = remote(Worker.save)
    load = remote(Worker.load)
    load_snapshot = remote(Worker.load_snapshot)
    has_checkpoint = remote_all(Worker.has_checkpoint)
    enable_snapshots = remote_all(Worker.enable_snapshots)
    newest_snapshot = remote_all(Worker.newest_snapshot)
    commit_saves = remote_all(Worker.commit_saves)
    saves_pending = remote_all(Worker.saves_pending)
    stop_following = remote_all(Worker.stop_following)
    reapplied = remote(Worker.reapplied)
    settle = remote_all(Worker.settle)

    def __init__(self, group: WorkerGroup, supervisor: Supervisor | None = None):
        self.group, self.supervisor = group, supervisor

    @property
    def role(self) -> str:
        return self.group.role

    @property
    def world_size(self) -> int:
        return self.group.world_size

    def call(self, fn: Callable[Concatenate[Any, P], R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Call any declared method of this role's worker class (e.g. an extra role's), waiting."""
        return RoleFuture(self, fn, args, kwargs).result()

    def submit(self, fn: Callable[Concatenate[Any, P], R], *args: P.args, **kwargs: P.kwargs) -> RoleFuture[R]:
        return RoleFuture(self, fn, args, kwargs)


class ActorProxy(RoleProxy):
    generate = remote(ActorWorker.generate)  # prompts -> responses, masks, old log-probs
    update = remote(ActorWorker.update)  # policy-loss epochs -> stats
    sync_weights = remote_all(ActorWorker.sync_weights)  # policy -> rollout engine; seconds per rank
    evaluate = remote(ActorWorker.evaluate)  # held-out prompts -> greedy responses (kuberl.controller.evaluation)
    compute_logprobs = remote(ActorWorker.compute_logprobs)  # the trained policy's log-probs (spec.rollout.async)
    policy_weights = remote_all(ActorWorker.policy_weights)  # full weights (rank 0's), pushed to the rollout role
    connect_env = remote_all(ActorWorker.connect_env)  # the env role's ranks, which hold the environments


class CriticProxy(RoleProxy):
    compute_values = remote(CriticWorker.compute_values)
    update = remote(CriticWorker.update)


class RefProxy(RoleProxy):
    compute_ref_logprobs = remote(RefWorker.compute_ref_logprobs)


class RewardProxy(RoleProxy):
    compute_scores = remote(RewardWorker.compute_scores)


class RolloutProxy(RoleProxy):
    submit = remote(RolloutWorker.submit)  # prompts -> queued as a ticket
    collect = remote_all(RolloutWorker.collect)  # a ticket's rollout per rank (None: lost with a dead worker)
    push_weights = remote_all(RolloutWorker.push_weights)  # the actor's weights and their version


class EnvProxy(RoleProxy):
    env_health = remote_all(EnvWorker.env_health)  # per rank (the actor calls the ranks directly)


PROXIES: dict[str, type[RoleProxy]] = {"actor": ActorProxy, "critic": CriticProxy, "ref": RefProxy,
                                       "reward": RewardProxy, "rollout": RolloutProxy, "env": EnvProxy}

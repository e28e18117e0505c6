"""Warm standbys (`spec.resilience.standby: true`): a role's spare set of ranks, ready before it is needed.

`StandbyGroup` holds the role's active ranks and a standby: a second group of the same size,
launched once the active ranks are up and set up in a background thread, so its processes have
imported torch and transformers, joined their own process group and built their models and
optimizers (ref and reward: the weights are loaded; actor and critic: built from the model path).
A trained role's standby then keeps up with it: after every completed step the supervisor sends it
`follow` (`Worker.follow_snapshot`), and it loads the role's per-step snapshot of that step
(`kuberl.resilience.saves`) into its own model and optimizer in the background, once the role's copy of it is
whole. When the role fails, `restart()` kills the active ranks and promotes the standby at once; the
supervisor then restores the trained state exactly as after a cold restart, which finds the snapshot
already loaded (the actor still copies it into its rollout engine), and a new standby starts in the
background. A standby that failed to start is replaced by a cold start.

The standby holds the role's resources twice (CPU, memory, GPUs, the `kuberl_role_<role>` resource):
on Kubernetes the operator runs a standby pod per rank for it. Its own trained state is never used:
it only ever holds a snapshot the active ranks wrote.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kuberl import logs
from kuberl.workers.groups import GroupCall, WorkerGroup

if TYPE_CHECKING:
    from kuberl.spec import JobSpec

log = logs.get("resilience")
Follow = tuple[Callable[..., Any], tuple[Any, ...]]  # a worker method and its arguments


class Warming:
    """A group being launched and set up in a background thread; `wait()` returns it ready, or raises
    why not. `follow(fn, args)` sends a call to its ranks once it is ready (at once if it is)."""

    def __init__(self, group: WorkerGroup, follow: Follow | None = None, results: list[Any] | None = None):
        """`follow`: the call to send as soon as the group is ready (the newest `follow` so far);
        `results`: where the answered follow calls go, as (how many this group answered before, result)."""
        self.group, self.error = group, None
        self.is_ready = self.cancelled = False
        self.following = follow
        self.calls: list[GroupCall] = []  # follow calls sent and not yet seen answered
        self.results = results if results is not None else []
        self.answered = 0
        self._launching, self._sending = threading.Lock(), threading.Lock()
        self.thread = threading.Thread(target=self._ready, name=f"standby-{group.role}", daemon=True)
        self.thread.start()

    def _ready(self) -> None:
        try:
            with self._launching:  # placement group and processes; `cancel` waits for them to exist
                if self.cancelled:
                    raise RuntimeError("the standby was shut down before it started")
                self.group.launch()
            self.group.wait_ready()
        except Exception as exc:  # a WorkerFailure, or Ray's own error when the standby is killed meanwhile
            self.error = exc
            return
        with self._sending:
            self.is_ready = True
            if self.following is not None:
                self._send(*self.following)

    def follow(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        with self._sending:
            self.following = (fn, args)
            if self.is_ready:
                self._send(fn, args)

    def _send(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Submit without waiting; earlier calls that answered are collected (their errors logged)."""
        for call in [c for c in self.calls if self.group.done(c)]:
            self.calls.remove(call)
            try:
                self.results.append((self.answered, self.group.collect(call)))
                self.answered += 1
            except Exception as exc:  # the standby is behind; a take-over loads the state itself
                log.info(f"role {self.group.role}: the standby's {call.name} failed ({exc})",
                         extra={"role": self.group.role})
        self.calls.append(self.group.submit(fn, args))

    def wait(self) -> WorkerGroup:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.group

    def ready(self) -> bool:
        return self.is_ready and self.error is None

    def cancel(self) -> None:
        """Kill the standby's processes (those being created included) and stop setting it up."""
        with self._launching:
            self.cancelled = True
            self.group.shutdown()
        self.thread.join(timeout=10)


class StandbyGroup(WorkerGroup):
    """One role's ranks with a warm standby behind them; calls go to the active ranks."""

    def __init__(self, make: Callable[[], WorkerGroup], active: WorkerGroup | None = None):
        """`make` builds one group of the role's ranks (a `RayWorkerGroup`), for every standby and for
        the active ranks unless `active` (not yet launched) is given."""
        self.make = make
        self.resized: JobSpec | None = None  # the role's spec after a resize (`make` builds at the first size)
        self.active = active or make()
        self.role, self.world_size = self.active.role, self.active.world_size
        self.standby: Warming | None = None
        self.followed: Follow | None = None  # the newest call the standby was asked to follow
        # the standbys' answered follow calls: (how many that standby had answered before, its result)
        self.follow_results: list[tuple[int, Any]] = []
        self.takeovers = 0

    def _make(self) -> WorkerGroup:
        group = self.make()
        if self.resized is not None:
            group.resize(self.resized)
        return group

    def resize(self, spec: JobSpec) -> None:
        """Take ``spec`` (the role's replicas changed) for the next start: the active ranks and every standby
        made from now on (the caller shuts the group down first, which ends the standby at the old size)."""
        self.resized = spec
        self.active.resize(spec)
        self.world_size = self.active.world_size

    def launch(self) -> None:
        self.active.launch()

    def wait_ready(self) -> None:
        """The active ranks ready; then the standby starts in the background (not competing with them)."""
        self.active.wait_ready()
        self.generation += 1
        self.standby = Warming(self._make(), self.followed, self.follow_results)

    def follow(self, fn: Callable[..., Any], *args: Any) -> None:
        """Send `fn(*args)` (a worker method) to the standby's ranks without waiting: now if it is set up,
        else once it is; a standby started later gets the newest such call too. A repeat is not sent."""
        if self.followed == (fn, args):
            return
        self.followed = (fn, args)
        if self.standby is not None:
            self.standby.follow(fn, args)

    def restart(self) -> bool:
        """Kill the active ranks and promote the standby (waiting for it if it is still setting up);
        start the next standby. Returns True when a standby took over, False after a cold start."""
        self.active.shutdown()
        standby, self.standby = self.standby, None
        took_over = False
        if standby is not None:
            try:
                self.active, took_over = standby.wait(), True
            except Exception as exc:
                log.info(f"role {self.role}: the standby did not start ({exc}); starting the role cold",
                         extra={"role": self.role})
                standby.cancel()
        if not took_over:
            self.active = self._make()
            self.active.start()
        self.takeovers += took_over
        self.generation += 1
        # launched in its own thread: the take-over waits for none of it
        self.standby = Warming(self._make(), self.followed, self.follow_results)
        return took_over

    def standby_ready(self) -> bool | None:
        return self.standby is not None and self.standby.ready()

    def wait_standby(self) -> None:
        """Block until the standby is set up (raises why it could not start)."""
        if self.standby is not None:
            self.standby.wait()

    def _submit(self, fn, info, per_rank, kwargs, fault) -> GroupCall:
        call = self.active._submit(fn, info, per_rank, kwargs, fault)
        call.generation = self.generation
        return call

    def collect(self, call: GroupCall) -> Any:
        return self.active.collect(call)

    def done(self, call: GroupCall) -> bool:
        return self.active.done(call)

    def identities(self) -> list[dict[str, Any]]:
        return self.active.identities()

    def endpoints(self) -> list[Any]:
        return self.active.endpoints()

    def shutdown(self) -> None:
        """Kill the active ranks and the standby."""
        self.active.shutdown()
        if self.standby is not None:
            self.standby.cancel()
            self.standby = None

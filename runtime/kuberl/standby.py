"""Warm standbys (`spec.resilience.standby: true`): a role's spare set of ranks, ready before it is needed.

`StandbyGroup` holds the role's active ranks and a standby: a second group of the same size,
launched once the active ranks are up and set up in a background thread, so its processes have
imported torch and transformers, joined their own process group and built their models (ref and
reward: the weights are loaded; actor and critic: built from the model path). When the role fails,
`restart()` kills the active ranks and promotes the standby at once; the supervisor then restores
the trained state (actor, critic: the last checkpoint) exactly as after a cold restart, and a new
standby starts in the background. A standby that failed to start is replaced by a cold start.

The standby holds the role's resources twice (CPU, memory, GPUs, the `kuberl_role_<role>` resource):
on Kubernetes the operator runs a standby pod per rank for it. Its own trained state is never used.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .groups import GroupCall, WorkerGroup


class Warming:
    """A group being set up in a background thread; `wait()` returns it ready, or raises why not."""

    def __init__(self, group: WorkerGroup):
        self.group, self.error = group, None
        group.launch()  # reserves the placement group and creates the processes (non-blocking)
        self.thread = threading.Thread(target=self._ready, name=f"standby-{group.role}", daemon=True)
        self.thread.start()

    def _ready(self) -> None:
        try:
            self.group.wait_ready()
        except Exception as exc:  # a WorkerFailure, or Ray's own error when the standby is killed meanwhile
            self.error = exc

    def wait(self) -> WorkerGroup:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.group

    def ready(self) -> bool:
        return not self.thread.is_alive() and self.error is None


class StandbyGroup(WorkerGroup):
    """One role's ranks with a warm standby behind them; calls go to the active ranks."""

    def __init__(self, make: Callable[[], WorkerGroup], active: WorkerGroup | None = None):
        """`make` builds one group of the role's ranks (a `RayWorkerGroup`), for every standby and for
        the active ranks unless `active` (not yet launched) is given."""
        self.make = make
        self.active = active or make()
        self.role, self.world_size = self.active.role, self.active.world_size
        self.standby: Warming | None = None
        self.takeovers = 0

    def launch(self) -> None:
        self.active.launch()

    def wait_ready(self) -> None:
        """The active ranks ready; then the standby starts in the background (not competing with them)."""
        self.active.wait_ready()
        self.generation += 1
        self.standby = Warming(self.make())

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
                print(f"[kuberl] role {self.role}: the standby did not start ({exc}); starting the role cold",
                      flush=True)
                standby.group.shutdown()
        if not took_over:
            self.active = self.make()
            self.active.start()
        self.takeovers += took_over
        self.generation += 1
        self.standby = Warming(self.make())
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

    def shutdown(self) -> None:
        """Kill the active ranks and the standby."""
        self.active.shutdown()
        if self.standby is not None:
            self.standby.group.shutdown()
            self.standby.thread.join(timeout=10)
            self.standby = None

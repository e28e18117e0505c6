"""Running a step's phases at the same time, and timing each one: the driver's scheduler.

    phases = Phases(roles, t0)                                     # t0: the step's start (perf_counter)
    scores = phases.start("reward", reward.compute_scores, batch)  # a role call, sent at once
    ref = phases.start("ref", ref.compute_ref_logprobs, batch)     # runs meanwhile, on the ref's group
    scores_out, ref_out = phases.wait(scores, ref)                 # both results, in this order

Each phase is a `RoleFuture` (kuberl.controller.proxies) sent under `roles.phase(name)`, so a role that fails
while other calls are in flight is recovered by that call's own wait and only that call is replayed
(a call in flight to the same failed group replays without a second restart); calls to other roles
are untouched. `wait` collects whichever call is back first, so a span ends when its result came
back (to within `POLL_S`), not when the driver got round to it. `spans()` gives them in seconds from
the step's start (`kuberl.metrics.record.Span`). `sequential=True` waits for each call as it is sent: one
phase after another, the loop the overlap's bit-identity test compares with. Roles that share GPUs
never overlap: each phase of one waits for the others' phases in flight.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kuberl.controller.proxies import BoundRemote, RoleFuture
from kuberl.controller.roles import Roles
from kuberl.data.batch import Batch
from kuberl.metrics.record import Span
from kuberl.spec.colocation import sharing

POLL_S = 0.002  # how often `wait` looks at the calls in flight


class Phase:
    """One role call in flight under a phase name; `start_t`/`end_t` are perf_counter seconds."""

    def __init__(self, role: str, name: str, future: RoleFuture[Any] | None, start_t: float):
        self.role, self.name, self.future = role, name, future
        self.start_t, self.end_t = start_t, start_t
        self.finished = future is None
        self.value: Any = None

    def finish(self) -> Any:
        """Wait for the result (the supervisor recovers the role if it failed) and close the span."""
        if not self.finished:
            self.value = self.future.result()
            self.end_t = time.perf_counter()
            self.finished = True
        return self.value


@dataclass
class Rollout:
    """A step's rollout, sent: its prompts Batch (the rollout's result is added to it), the call, and
    the data loader's position before those prompts were drawn (where a resume starts again)."""

    prompts: Batch
    phase: Phase
    data_before: dict[str, int]


class Phases:
    """The phases of one step: role calls in flight and driver work, each with its span."""

    def __init__(self, roles: Roles, t0: float, sequential: bool = False):
        self.roles, self.t0, self.sequential = roles, t0, sequential
        self.phases: list[Phase] = []
        self.inner: list[Span] = []  # work inside a phase that the role reports (`within`): not phases themselves

    def start(self, name: str, method: BoundRemote[..., Any], *args: Any, **kwargs: Any) -> Phase:
        """Send `method(*args, **kwargs)` to its role as phase `name`; returns at once (unless sequential).
        A role that shares its GPUs (`kuberl.spec.colocation`) waits first for the phases in flight on the roles
        it shares them with, so that only one of them holds its phase's GPU memory at a time
        (`kuberl.training.idle`)."""
        role = method.proxy.role
        for other in self.phases:
            if not other.finished and other.role != role and other.role in sharing(self.roles.spec, role):
                other.finish()
        t = time.perf_counter()
        with self.roles.phase(name):
            phase = Phase(role, name, method.submit(*args, **kwargs), t)
        if self.sequential or phase.future.done():  # in-process, the call ran to its end when sent
            phase.finish()
        self.phases.append(phase)
        return phase

    def adopt(self, phase: Phase) -> None:
        """A phase sent before this step began (the rollout generated ahead under spec.rollout.asynchronous)."""
        self.phases.append(phase)

    def wait(self, *phases: Phase | None) -> list[Any]:
        """The results of `phases` (None for a None), in their order; each collected once it is back (or
        failed). The last one left is waited on directly, so a hung rank is found by its group's call
        timeout, counted from when the other calls were back; with none back for a whole call timeout
        (several hung at once), the oldest is waited on directly."""
        pending = [p for p in phases if p is not None and not p.finished]
        patience, last_back = self.roles.spec.resilience.call_timeout_seconds, time.perf_counter()
        while len(pending) > 1:
            ready = [p for p in pending if p.future.done()]
            if not ready and time.perf_counter() - last_back > patience:
                ready = pending[:1]
            for p in ready:
                p.finish()
                last_back = time.perf_counter()
            pending = [p for p in pending if not p.finished]
            if pending and not ready:
                time.sleep(POLL_S)
        for p in pending:
            p.finish()
        return [None if p is None else p.value for p in phases]

    def run(self, name: str, method: BoundRemote[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Send and wait: a phase nothing else of this step runs beside."""
        return self.start(name, method, *args, **kwargs).finish()

    @contextmanager
    def local(self, name: str, role: str = "driver") -> Iterator[None]:
        """Time work the driver does itself (`role`: the role the calls made inside go to)."""
        phase = Phase(role, name, None, time.perf_counter())
        with self.roles.phase(name):
            yield
        phase.end_t = time.perf_counter()
        self.phases.append(phase)

    def within(self, phase: Phase, role: str, spans: Iterable[tuple[str, float, float]]) -> None:
        """Spans of work done inside `phase` as its role reported them, (name, start, end) in seconds from when the
        role began the call (e.g. the environment calls of a multi-turn rollout), shown on row `role`. Placed from
        the phase's start as the driver sent it: early by the time the call took to reach the role."""
        base = phase.start_t - self.t0
        self.inner += [Span(role, name, base + start, base + end) for name, start, end in spans]

    def spans(self) -> list[Span]:
        """Every finished phase's span and the spans reported inside them (`within`), seconds from the step's
        start, in the order they began."""
        return sorted(self._phase_spans() + self.inner, key=lambda s: s.start_s)

    def _phase_spans(self) -> list[Span]:
        return [Span(p.role, p.name, p.start_t - self.t0, p.end_t - self.t0)
                for p in sorted(self.phases, key=lambda p: p.start_t) if p.finished]

    def durations(self) -> dict[str, float]:
        """Seconds per phase name (summed where a phase ran more than once); not the spans inside them."""
        out: dict[str, float] = {}
        for s in self._phase_spans():
            out[s.phase] = out.get(s.phase, 0.0) + s.end_s - s.start_s
        return out

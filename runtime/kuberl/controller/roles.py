"""`Roles`: a job's roles as typed, supervised proxies, for a control flow of one's own (public as `kuberl.library`).

    from kuberl.library import Roles
    from kuberl.workers.groups import RayWorkerGroup

    roles = Roles(spec, lambda role: RayWorkerGroup(role, spec))   # colocateWith: shared=SharedPlacement(spec)
    with roles:                                   # starts every enabled role, each in its own group
        for step in range(1, n + 1):
            roles.begin_step(step)
            with roles.phase("rollout"):
                batch = roles.actor.generate(prompts, seed=step)
            ...
            roles.end_step()

`Roles` is the `Supervisor` of its proxies: when a role's worker dies or hangs, only that role's
group is torn down, recreated and restored (actor and critic from their snapshot of the last
completed step, `kuberl.resilience.saves`, else the last checkpoint saved with `save_checkpoint`; other roles
from the model path), and the interrupted call is replayed. A snapshot is copied beside the next
step's first phases: a role that died before its copy of update k was whole comes back from step
k - 1 and runs update k again (an update is a `trains=True` method; the proxies hand each completed
one to `Roles.updated`, which keeps the last per role). With `spec.resilience.standby` each
role's warm standby takes the failed ranks' place (`kuberl.resilience.standby`). Each
recovery is kept in `history[role]`; a role that fails more often than `spec.roles.<role>.maxRestarts`
allows raises `JobFailed`. docs/library.md has the whole API; `kuberl.controller.driver` is the built-in PPO and
GRPO program written on it, and `examples/remax.py` another one.

`Roles` makes the calls to the roles; the books of their saved state (trained steps, checkpoints, snapshot
folders, what a restore loads) are kept by its `RoleState` (`kuberl.controller.role_state`). `Prompts`
(`kuberl.data.prompts`) and the errors that end a job (`kuberl.controller.job_errors`) are importable from here and
from `kuberl.library` too.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kuberl import logs
from kuberl.controller.job_errors import CheckpointUntrusted, JobFailed, PlacementDegraded
from kuberl.controller.proxies import (
    PROXIES,
    ActorProxy,
    CriticProxy,
    EnvProxy,
    RefProxy,
    RewardProxy,
    RoleProxy,
    RolloutProxy,
)
from kuberl.controller.role_state import HOST_MEMORY, IN_FLIGHT, PendingCheckpoint, RoleState
from kuberl.data.prompts import Prompts
from kuberl.metrics.record import Recovery, RoleStep
from kuberl.resilience import checkpoint, saves
from kuberl.spec import JobSpec, enabled_roles
from kuberl.spec.colocation import sharing
from kuberl.spec.contract import Reason, restart_budget_spent
from kuberl.spec.model import TRAINING_ROLES
from kuberl.training import gcfreeze
from kuberl.workers import Worker
from kuberl.workers.dispatch import method_info
from kuberl.workers.env import stuck_problem
from kuberl.workers.groups import WorkerFailure, WorkerGroup

log = logs.get("resilience")

__all__ = ["HOST_MEMORY", "STATEFUL", "CheckpointUntrusted", "Fault", "JobFailed", "PendingCheckpoint",
           "PlacementDegraded", "Prompts", "RoleHistory", "Roles"]

STATEFUL = TRAINING_ROLES  # roles whose state (weights, optimizer) is trained and checkpointed
T = TypeVar("T", bound=RoleProxy)


@dataclass
class Fault:
    """An injected fault: `mode` ("kill", "hang" or "stop": SIGSTOP) hits `role`'s first faultable call of `step`; with
    `phase` "checkpoint", its save of step `step`'s checkpoint (mode "slow" too: that write is held back
    `kuberl.workers.base.SLOW_WRITE_S`); with "snapshot" (a kill), its update of step `step` runs but the snapshot
    copy of it never finishes, and the role dies at its next call."""

    role: str
    step: int
    mode: str = "kill"
    fired: bool = False
    phase: str = ""


@dataclass
class RoleHistory:
    """A role's restarts since the job began (restored from checkpoints) and this run's recoveries."""

    restarts: int = 0
    recoveries: list[Recovery] = field(default_factory=list)


class Roles:
    """The running roles of one job: WorkerGroups behind typed proxies, with per-role recovery."""

    def __init__(self, spec: JobSpec, make_group: Callable[[str], WorkerGroup], faults: list[Fault] | None = None,
                 checkpoint_root: Path | None = None, name: str = "job"):
        self.spec, self.make_group, self.name = spec, make_group, name
        self.roles = enabled_roles(spec)
        self.faults = faults or []
        self.saved = RoleState(checkpoint_root, name)  # the books of the trainable roles' checkpoints and snapshots
        self.groups: dict[str, WorkerGroup] = {}
        self.settled: dict[str, int] = {}  # role -> its group's generation whose processes were settled (gcfreeze)
        self.proxies: dict[str, RoleProxy] = {}
        self.history = {r: RoleHistory() for r in self.roles}
        self.worst_links: dict[str, str | None] = {}
        self.topology_sources: dict[str, str] = {}  # role -> where its ranks read the links (nvml, nvidia-smi, none)
        self.hosts: dict[str, list[str]] = {}  # role -> its ranks' hostnames, in rank order
        self.step = 0  # completed steps: the step in progress is step + 1
        self._phase = ""
        self.on_restart: list[Callable[[Recovery], None]] = []  # called after each role restart
        self.on_budget_spent: list[Callable[[str], None]] = []  # called before JobFailed is raised

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Create every enabled role's group (in parallel), wait until all are ready, check placement."""
        for role in self.roles:
            self.groups[role] = self._new_group(role)
            self.groups[role].launch()
        self.saved.drop_snapshots()  # a previous run's snapshots are past the checkpoint it resumes from
        self.saved.remember_record()
        for role in self.roles:
            self.groups[role].wait_ready()
            self.proxies[role] = PROXIES.get(role, RoleProxy)(self.groups[role], self)
            self._enable_snapshots(role)
        self._wire_env()
        self.check_placement()

    def _new_group(self, role: str) -> WorkerGroup:
        """The role's group; behind a warm standby when the spec asks (`JobSpec.standby`) and the group's
        ranks are separate processes (Ray), not in-process ones."""
        group = self.make_group(role)
        if not (self.spec.standby(role) and group.standby_capable):
            return group
        from kuberl.resilience.standby import StandbyGroup

        return StandbyGroup(lambda: self.make_group(role), active=group)

    def wait_standbys(self) -> None:
        """Block until every role's warm standby is set up (no-op without spec.resilience.standby)."""
        for group in self.groups.values():
            group.wait_standby()

    def shutdown(self) -> None:
        for group in self.groups.values():
            group.shutdown()
        self.saved.drop_snapshots(host_memory_only=True)
        gcfreeze.thaw()

    def __enter__(self) -> Roles:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # -- the proxies -------------------------------------------------------------------------------
    @property
    def actor(self) -> ActorProxy:
        return self.proxy("actor", ActorProxy)

    @property
    def critic(self) -> CriticProxy | None:
        return self.proxy("critic", CriticProxy) if "critic" in self.proxies else None

    @property
    def ref(self) -> RefProxy | None:
        """The ref role; with a LoRA actor and ref disabled, the actor itself (its base model, adapters off)."""
        if "ref" in self.proxies:
            return self.proxy("ref", RefProxy)
        actor_lora = self.spec.roles.actor.lora
        if actor_lora.enabled and actor_lora.base_frozen and not self.spec.roles.ref.enabled:
            return RefProxy(self.groups["actor"], self)
        return None

    @property
    def reward(self) -> RewardProxy:
        return self.proxy("reward", RewardProxy)

    @property
    def rollout(self) -> RolloutProxy | None:
        """The rollout role of spec.rollout.async, else None."""
        return self.proxy("rollout", RolloutProxy) if "rollout" in self.proxies else None

    @property
    def env(self) -> EnvProxy | None:
        """The env role of spec.environment (spec.roles.env), else None (no environment, or in the actor's ranks)."""
        return self.proxy("env", EnvProxy) if "env" in self.proxies else None

    def _wire_env(self) -> None:
        """Give the actor's ranks the env role's, which its rollouts call directly: after either (re)started."""
        if "env" in self.proxies and "actor" in self.proxies:
            self.actor.connect_env(self.groups["env"].endpoints())

    def proxy(self, role: str, cls: type[T] = RoleProxy) -> T:  # type: ignore[assignment]
        """Role `role` behind proxy class `cls` (an extra role's own `RoleProxy` subclass)."""
        current = self.proxies[role]
        if not isinstance(current, cls):
            current = self.proxies[role] = cls(self.groups[role], self)
        return current

    # -- the saved state (kept by `self.saved`, a `kuberl.controller.role_state.RoleState`) ---------------------
    @property
    def checkpoint_root(self) -> Path | None:
        return self.saved.checkpoint_root

    @property
    def snapshot_root(self) -> Path | None:
        """Where the trainable roles' snapshots go when not in host memory (None: they keep none)."""
        return self.saved.snapshot_root

    @snapshot_root.setter
    def snapshot_root(self, root: Path | None) -> None:
        self.saved.snapshot_root = root

    @property
    def last_checkpoint(self) -> int:
        """The newest complete checkpoint's step (0: none)."""
        return self.saved.last_checkpoint

    # -- steps and phases --------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """The program starts step `step` (1-based; faults for this step may fire from now on)."""
        self.step = step - 1

    def resume(self, step: int, restarts: dict[str, int]) -> None:
        """Take the job up after its complete checkpoint of step `step`, its roles' `restarts` since it began
        as that checkpoint recorded them (faults of steps up to `step` fired then); `load_checkpoint` loads it."""
        self.step = step
        self.saved.at_checkpoint(step)
        for role, n in restarts.items():
            if role in self.history:
                self.history[role].restarts = n
        for f in self.faults:
            f.fired = f.fired or f.step <= self.step

    def end_step(self) -> None:
        """The step is complete once its updates have returned: their snapshots are copied in the background,
        beside the next step's first phases (each role's next update waits for its own), and a role that dies
        before its copy is whole runs the update again (`recover`). A checkpoint started in an earlier step is
        committed at the first step's end that finds its writes done: none waits for them here. The env role's
        ranks are checked here too (`_check_env`)."""
        if self.env is not None:
            self._check_env()
        if self.saved.pending and not self._writing():
            self.commit(snapshots=False)
        for role in self._stateful():
            self._follow(role, self.saved.trained[role])
        self._settle()
        self.step += 1

    def _check_env(self) -> None:
        """The env role's step-end check: a dead rank is restarted (the supervised call fails) even if no
        trajectory of the step reached it, and so is the role when a rank's hung environment calls hold half its
        slots (`kuberl.workers.env.stuck_problem`), where its ranks have processes of their own (in-process, each
        rollout has threads of its own and a restart would end none). No rollout is in flight here: one sent ahead
        (`rollout.asynchronous`) has been waited for with the step's updates."""
        env, group = self.spec.environment, self.groups["env"]
        assert self.env is not None and env is not None
        health = self.env.env_health()
        if group.own_processes and (stuck := stuck_problem(health, env.concurrency, env.timeout_seconds)):
            detail, oldest_s = stuck
            self.recover(WorkerFailure("env", Reason.WORKER_HUNG, detail), self._phase, detect_s=oldest_s)

    def _writing(self) -> bool:
        """Whether any stateful role's checkpoint write is still in flight."""
        return any(any(self.proxies[role].saves_pending()) for role in self._stateful())

    def _settle(self) -> None:
        """The driver and every role's processes new since the last step (started, restarted, resized): their
        long-lived objects frozen out of the cycle collector's way once they have run a step
        (`kuberl.training.gcfreeze`)."""
        gcfreeze.settle()
        for role, proxy in self.proxies.items():
            if self.settled.get(role) != proxy.group.generation:
                proxy.settle()
                self.settled[role] = proxy.group.generation

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Name the phase the calls inside belong to (a recovery records it)."""
        before, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = before

    def mark(self) -> dict[str, int]:
        """Where each role's recoveries stand now (pass it to `role_steps` at the end of the step)."""
        return {r: len(h.recoveries) for r, h in self.history.items()}

    def role_steps(self, since: dict[str, int], memory: dict[str, dict[str, int]] | None = None) -> dict[str, RoleStep]:
        """Each role's part of a step record: restarts, the recoveries since `mark()`, memory, worst link."""
        return {role: RoleStep(restarts=h.restarts, recoveries=h.recoveries[since.get(role, 0):],
                               memory=(memory or {}).get(role, {}), worst_link=self.worst_links.get(role),
                               topology_source=self.topology_sources.get(role),
                               last_failure=h.recoveries[-1].summary() if h.recoveries else None,
                               standby_ready=self.groups[role].standby_ready() if role in self.groups else None,
                               replicas=self.spec.roles.get(role).replicas, hosts=self.hosts.get(role))
                for role, h in self.history.items()}

    def memory(self) -> dict[str, dict[str, int]]:
        """Every role's peak memory now (rank 0's), by kind: one call per role, which also checks the
        role is alive (a dead one is recovered here)."""
        return {role: proxy.memory() for role, proxy in self.proxies.items()}

    # -- checkpoints -------------------------------------------------------------------------------
    def save_checkpoint(self, step: int, state: dict[str, Any] | None = None) -> Path:
        """Start saving the stateful roles' state for completed step `step` (written in the background);
        returns the step's folder. `commit` (at the end of the next step, or called) marks it complete,
        writing `state` (the program's own: data position, ...) as its state file, once every role's part
        is whole. A role that does not hold step `step`'s state makes the checkpoint void: it is removed, never
        marked complete. That is a role restored from older state after a failure, or one already past the step
        (the next step's update applied, the step not yet counted: a resume from it would apply that update
        twice)."""
        self.saved.begin_save(step)  # a failure from here on is recorded in this checkpoint's phase and step
        if len(self.saved.pending) >= IN_FLIGHT:  # the ones before first: the roles write one after another
            self.commit(snapshots=False)
        d = checkpoint.fresh_step_dir(self.saved.root(), step)
        stale, committed = [], dict(self.saved.trained)  # a restore during the save lowers the trained steps
        with self.phase("checkpoint"):
            for role in self._stateful():
                held = self.proxies[role].save(str(d / role))
                if held != committed[role] or held != step:
                    stale.append(f"{role} holds step {held}")
        if stale:
            self.commit(snapshots=False)  # the writes end before the folder goes
            self.saved.void(step, d, stale)
            return d
        self.saved.hold(step, d, state)
        return d

    def commit(self, dead: str | None = None, snapshots: bool = True) -> None:
        """Wait for the stateful roles' checkpoint writes in flight (and, with `snapshots`, their snapshot
        copies); then mark each pending checkpoint, oldest first, complete if every role's part is whole (else
        remove it).
        `dead`: a role that is not restarted (its budget spent); its part is checked on the driver's side."""
        for role in self._stateful():
            if role != dead:
                self.proxies[role].commit_saves(snapshots)
        for pending in self.saved.take_pending():
            torn = [role for role in self._stateful() if not self._part_whole(role, pending.folder / role, dead)]
            self.saved.complete(pending, torn, self.spec.trainer.checkpoint.keep)

    def _part_whole(self, role: str, folder: Path, dead: str | None) -> bool:
        """Whether `role`'s part of a checkpoint (`folder`) is whole: asked of its ranks, or read on the
        driver's side for the `dead` role."""
        if role == dead:
            return saves.complete(folder)
        return all(self.proxies[role].has_checkpoint(str(folder)))

    def load_checkpoint(self, step: int) -> None:
        """Load every stateful role from the checkpoint of step `step`."""
        for role in self._stateful():
            self.proxies[role].load(self.saved.checkpoint_of(role, step), step)
            self.saved.loaded(role, step)
        self.saved.at_checkpoint(step)

    def _stateful(self) -> list[str]:
        return [role for role in TRAINING_ROLES if role in self.proxies]

    def _snapshots_on(self, role: str) -> bool:
        """spec.resilience.snapshots for `role`: auto means on, but for a role that shares its GPUs (colocateWith),
        whose copy would be waited for before each of its sleeps (`kuberl.training.idle`), on the training path."""
        mode = self.spec.resilience.snapshots
        return mode == "on" or (mode == "auto" and not sharing(self.spec, role))

    def _gpus(self, role: str) -> bool:
        return bool(self.spec.roles.get(role).gpus)

    def _snapshot_dir(self, role: str) -> Path | None:
        """Where `role`'s ranks keep their snapshots (`RoleState.snapshot_dir`); None without a checkpoint root."""
        return self.saved.snapshot_dir(role, self._gpus(role))

    def _enable_snapshots(self, role: str) -> None:
        if role in TRAINING_ROLES and self.snapshot_root is not None and self._snapshots_on(role):
            RoleProxy(self.groups[role]).enable_snapshots(str(self._snapshot_dir(role)))

    def _follow(self, role: str, step: int) -> None:
        """Have the role's warm standby load its snapshot of committed step `step` now, in the background."""
        if step > 0 and self.snapshot_root is not None and self._snapshots_on(role):
            self.groups[role].follow(Worker.follow_snapshot, str(self._snapshot_dir(role)), step)

    # -- placement ---------------------------------------------------------------------------------
    def check_placement(self, roles: list[str] | None = None) -> None:
        """Record each role's worst GPU link; under `required`, refuse to train below minLink."""
        from kuberl.topology.placement import placement_problem, worst_link

        problems = []
        for role in roles or list(self.groups):
            infos = RoleProxy(self.groups[role]).placement_info()
            self.worst_links[role] = worst_link([p["worst_link"] for p in infos if p["worst_link"]])
            self.hosts[role] = [p["host"] for p in infos]
            sources = {p["topology_source"] for p in infos if p["topology_source"]}
            self.topology_sources[role] = ",".join(sorted(sources))
            problem = placement_problem(self.spec, role, self.worst_links[role])
            if problem:
                problems.append(problem)
        if problems:
            raise PlacementDegraded("; ".join(problems))

    # -- supervision (the proxies' Supervisor) -----------------------------------------------------
    def current_phase(self) -> str:
        return self._phase

    def fault_for(self, role: str, fn: Callable[..., Any]) -> str | None:
        saving = self._phase == "checkpoint"
        step = self.saved.saving if saving else self.step + 1
        for f in self.faults:
            if f.role != role or f.step != step or f.fired:
                continue
            if f.phase == "snapshot" and not saving and method_info(fn).trains:
                f.fired = True
                return "kill_in_snapshot"
            if f.phase == ("checkpoint" if saving else ""):
                f.fired = True
                return f.mode
        return None

    def updated(self, role: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.saved.updated(role, self.step + 1, (fn, args, kwargs))

    def recover(self, failure: WorkerFailure, phase: str, detect_s: float, in_flight: list[str] | None = None
                ) -> Recovery:
        """Recreate only `failure.role`'s group and restore its state. A recreate that fails again (no
        capacity in time, a rank dying during start) counts as another restart of the same budget."""
        role = failure.role
        step = self.saved.saving if phase == "checkpoint" else self.step + 1  # the step whose work failed
        rec = Recovery(role, step, phase, failure.reason, failure.detail, detect_s=detect_s,
                       diagnosis=failure.diagnosis, in_flight=in_flight or [phase or "no phase"])
        history, budget = self.history[role], self.spec.roles.get(role).max_restarts
        group, restarts_before = self.groups[role], history.restarts
        t0 = time.perf_counter()
        while True:
            if restart_budget_spent(history.restarts + 1, budget):
                for hook in self.on_budget_spent:
                    hook(role)
                field = f"spec.{self.spec.roles.path(role)}.maxRestarts"
                raise JobFailed(f"role {role} failed at step {rec.step} ({rec.detail}) and reached "
                                f"maxRestarts={budget} ({field}); last checkpoint: step {self.last_checkpoint}")
            history.restarts += 1
            rec.attempts = history.restarts - restarts_before
            log.info(f"role {role} failed in phase {rec.phase} of step {rec.step}: {rec.detail}; restarting {role} "
                     f"only ({history.restarts}/{budget})", extra={"job": self.name, "role": role, "step": rec.step})
            try:
                rec.standby = group.restart()
                rec.restored_from, held = self._restore(role) if role in TRAINING_ROLES else ("model path", 0)
                if role in TRAINING_ROLES and (again := self._updates_again(role, held)):
                    held += again
                    rec.restored_from += (f", then its update of step {held} again" if again == 1 else
                                          f", then its updates of steps {held - again + 1}-{held} again")
                break
            except WorkerFailure as again:
                rec.detail = f"{rec.detail}; recreating it failed: {again.detail}"
        if role in TRAINING_ROLES:  # committed updates the restore did not bring back
            rec.steps_lost = self.saved.restored(role, held)
        if role in ("actor", "env"):
            self._wire_env()
        self.check_placement([role])
        rec.hosts = list(self.hosts.get(role, []))
        rec.ready_s = time.perf_counter() - t0
        history.recoveries.append(rec)
        for hook in self.on_restart:
            hook(rec)
        return rec

    def _updates_again(self, role: str, held: int) -> int:
        """Run the role's completed updates after restored state `held` again on its new ranks, oldest first (it
        died before their snapshots were whole, or while they were skipped); each update is a function of the
        state and the batch the driver kept. Returns how many ran."""
        updates = self.saved.updates_to_repeat(role, held)
        proxy = RoleProxy(self.groups[role])  # unsupervised: a failure here is caught by `recover`
        for fn, args, kwargs in updates:
            proxy.call(fn, *args, **kwargs)
        if updates:
            proxy.reapplied()
        return len(updates)

    def resize(self, spec: JobSpec, role: str) -> int:
        """Between two steps: recreate only ``role``'s group at its size in ``spec``; other roles' workers are
        untouched. A frozen role loads the model path; a trainable one loads the complete checkpoint of the
        last completed step (DCP: world-size independent), which the caller has committed (`Driver._checkpoint_now`).
        Its snapshots, written for the old world size, are dropped. Returns the old world size."""
        group, before = self.groups[role], self.groups[role].world_size
        if role in TRAINING_ROLES and self.last_checkpoint != self.step:
            raise ValueError(f"resizing {role} needs the checkpoint of step {self.step} committed first")
        group.shutdown()
        group.resize(spec)
        self.spec = spec
        group.start()
        if role in TRAINING_ROLES:
            self.saved.resized(role, self._gpus(role))
            self._enable_snapshots(role)
            if self.step > 0:
                self.proxies[role].load(self.saved.checkpoint_of(role, self.step), self.step)
            self.saved.loaded(role, self.step)
        if role in ("actor", "env"):
            self._wire_env()
        self.check_placement([role])
        return before

    def _restore(self, role: str) -> tuple[str, int]:
        """Load the role's newest state its new ranks can see: its snapshot of the last completed step
        (`kuberl.resilience.saves`), else the last checkpoint (shared storage), else the model path. Returns where
        the state came from and its trained step."""
        proxy = RoleProxy(self.groups[role])  # unsupervised: a failure here is caught by `recover`
        proxy.stop_following()  # a standby that took over: no longer waits for the old ranks' snapshots
        self._enable_snapshots(role)
        folder = self._snapshot_dir(role)
        snap = None if folder is None else self.saved.snapshot_to_load(proxy.newest_snapshot(str(folder)))
        if snap is not None:
            loaded = proxy.load_snapshot(snap)
            return f"snapshot step {snap}{'' if loaded else ', held by the standby'}", snap
        step = self.last_checkpoint
        if step == 0:
            return "model path", 0
        path = self.saved.checkpoint_of(role, step)
        if not all(proxy.has_checkpoint(path)):
            log.warning(f"the new {role} ranks cannot see {path} (no shared checkpoint volume: "
                        f"spec.trainer.checkpoint.volumeClaim); {role} restarts from the model path",
                        extra={**logs.STDOUT, "job": self.name, "role": role})
            return "model path (checkpoint not visible to the new ranks)", 0
        proxy.load(path, step)
        return f"checkpoint step {step}", step

"""WorkerGroups: N workers of one role behind one interface, on Ray or in-process.

`submit(fn, args, kwargs)` starts a worker method (one decorated with `kuberl.workers.dispatch.register`) on
every rank, spreading the arguments as the method's `Dispatch` mode says, and returns a `GroupCall`;
`collect(call)` waits and gathers the results the same way. A dead or hung rank surfaces as
`WorkerFailure(role, reason, detail)`, an exception raised by the role's code as `RoleError`. A call
counts as hung after `kuberl.resilience.hangs.hang_timeout` seconds; the hung ranks' stacks are logged first.
Callers normally go through `kuberl.controller.proxies`, which add typed methods, futures and recovery.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kuberl import logs
from kuberl.resilience import hangs, ownlink
from kuberl.spec import JobSpec, role_resource
from kuberl.spec.colocation import SharedPlacement, gpu_share, rank_cpus, sharing
from kuberl.spec.contract import Reason
from kuberl.training.kernels import KernelOptions
from kuberl.workers import Worker, worker_class
from kuberl.workers.dispatch import MethodInfo, gather, method_info, scatter

log = logs.get("resilience")
# NCCL's flight recorder, read by torch's watchdog in GPU ranks: on a collective timeout it logs and
# dumps the last collectives of every rank (which collective, which rank did not join)
NCCL_FLIGHT_RECORDER = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}


class WorkerFailure(RuntimeError):
    """A role's worker died or stopped answering: `reason` is the code, `detail` says what happened."""

    def __init__(self, role: str, reason: Reason, detail: str, diagnosis: str = "", error: str = ""):
        """`diagnosis`: a hang's one-line summary (`kuberl.resilience.hangs.summarize`); `error`: the exception
        ("Type: message") a rank raised, when one did (a replay raising the same one is deterministic)."""
        super().__init__(f"role {role}: {detail}")
        self.role, self.reason, self.detail = role, reason, detail
        self.diagnosis, self.error = diagnosis, error


class LinkBroken(WorkerFailure):
    """The connection to a live rank broke during a call (a partition, a cut driver): Ray cannot say whether the
    call ran. A repeatable call is sent again to the same ranks (`kuberl.controller.proxies`); any other restarts the
    role."""

    def __init__(self, role: str, detail: str):
        super().__init__(role, Reason.WORKER_UNREACHABLE, detail)


class RoleError(RuntimeError):
    """A role's code raised (e.g. a reward function's bug): deterministic, so not worth a restart."""

    reason = Reason.ROLE_ERROR

    def __init__(self, role: str, error: str, public: str | None = None):
        super().__init__(f"role {role} raised {error}")
        self.role = role
        self.public = f"role {role} raised {public or error}"  # for the status: no sample text (error_text)


def error_text(cause: BaseException) -> str:
    """A rank's exception in one line for the job's status and Events: its own ``public`` text when it has one
    (a reward function's error leaves out the sample and its message), else its last line."""
    public = getattr(cause, "public", None)
    if isinstance(public, str):
        return public
    text = str(cause).strip()
    return text.splitlines()[-1] if text else ""


def world_size(spec: JobSpec, role: str) -> int:
    """Ranks of a role (RoleSpec.world_size)."""
    return spec.roles.get(role).world_size


def local_ranks(nodes: list[tuple[str, list[int]]]) -> list[tuple[int, list[int]]]:
    """Per rank: (its rank among the group's ranks on its node, the GPUs those ranks hold together)."""
    by_node: dict[str, list[int]] = {}
    for node, gpus in nodes:
        by_node.setdefault(node, []).extend(gpus)
    seen: dict[str, int] = {}
    out = []
    for node, _ in nodes:
        out.append((seen.get(node, 0), sorted(by_node[node])))
        seen[node] = seen.get(node, 0) + 1
    return out


@dataclass
class GroupCall:
    """A call started on every rank of a group: what `collect` needs to wait for and gather it."""

    info: MethodInfo
    generation: int  # the group's generation it was sent to (a restart starts a new one)
    refs: list[Any]  # Ray object refs, or the in-process results
    error: BaseException | None = None  # in-process: what the call raised
    name: str = ""  # the worker method's qualified name (hang timeouts are per method)
    sent_at: float = field(default_factory=time.perf_counter)


class WorkerGroup(ABC):
    role: str
    world_size: int
    generation: int = 0  # bumped by every (re)start: a call sent to an older generation died with it
    standby_capable = False  # whether spec.resilience.standby can keep a second set of these ranks warm
    own_processes = False  # whether its ranks are processes of their own (a restart ends their threads)

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
               fault: str | None = None) -> GroupCall:
        """Start `fn` (a worker method) on every rank; `fault` ("kill", "hang") hits the last rank."""
        info = method_info(fn)
        call = self._submit(fn, info, scatter(info, self.world_size, args), kwargs or {}, fault)
        call.name = fn.__qualname__
        return call

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Submit and collect, with no recovery: a failure raises (proxies add recovery)."""
        return self.collect(self.submit(fn, args, kwargs))

    @abstractmethod
    def _submit(self, fn: Callable[..., Any], info: MethodInfo, per_rank: list[tuple[Any, ...]],
                kwargs: dict[str, Any], fault: str | None) -> GroupCall: ...

    @abstractmethod
    def collect(self, call: GroupCall) -> Any:
        """Wait for `call` and gather its per-rank results as its dispatch mode says."""

    @abstractmethod
    def done(self, call: GroupCall) -> bool:
        """Whether every rank has answered `call` (collect would not wait)."""

    def start(self) -> None:
        """Launch and wait until every rank is set up."""
        self.launch()
        self.wait_ready()

    def restart(self) -> bool:
        """Replace every rank after a failure; True when a warm standby took over (`kuberl.resilience.standby`)."""
        self.shutdown()
        self.start()
        return False

    @abstractmethod
    def launch(self) -> None:
        """Begin creating the workers; `wait_ready` completes it (lets roles start in parallel)."""

    @abstractmethod
    def wait_ready(self) -> None: ...

    @abstractmethod
    def shutdown(self) -> None: ...

    def identities(self) -> list[dict[str, Any]]:
        return self.call(Worker.identity)

    @abstractmethod
    def endpoints(self) -> list[Any]:
        """The ranks as another role's process reaches them directly (the env role's, by the actor): Ray actor
        handles, or the in-process workers."""

    def resize(self, spec: JobSpec) -> None:
        """Take ``spec`` (the role's replicas changed) for the next start: its world size follows."""
        self.spec, self.world_size = spec, world_size(spec, self.role)

    def standby_ready(self) -> bool | None:
        """Whether the role's warm standby is ready to take over; None: the role keeps no standby."""
        return None

    def wait_standby(self) -> None:
        """Block until the role's warm standby is set up (no standby: returns at once)."""
        return None

    def follow(self, fn: Callable[..., Any], *args: Any) -> None:
        """Send `fn(*args)` to the role's warm standby without waiting (`kuberl.resilience.standby`); no standby:
        nothing."""
        return None


class LocalWorkerGroup(WorkerGroup):
    """One in-process worker (world size 1), no Ray: the GPU benchmark path. Faults are not supported;
    a call runs to its end when submitted."""

    def __init__(self, role: str, spec: JobSpec, device: str = "auto", worker_cls: type[Worker] | None = None,
                 kernels: KernelOptions | None = None):
        """`kernels`: the training kernels the worker uses (default: what a job uses on its device)."""
        self.role, self.spec, self.device, self.world_size = role, spec, device, 1
        self.worker_cls = worker_cls or worker_class(spec, role)
        self.kernels = kernels
        self.worker: Worker | None = None

    def launch(self) -> None:
        """In-process: nothing to launch ahead of time."""

    def wait_ready(self) -> None:
        from kuberl.training import dist as kdist

        self.worker = self.worker_cls(self.spec.model_dump_json(by_alias=True), self.role, 0, 1, self.device,
                                      kernels=self.kernels)
        addr = "127.0.0.1"
        self.worker.init(addr, 0 if kdist.dist.is_initialized() else kdist.free_port(addr))
        self.generation += 1

    def _submit(self, fn, info, per_rank, kwargs, fault):
        if fault:
            raise ValueError("fault injection needs separate worker processes: use the ray backend")
        try:
            return GroupCall(info, self.generation, [self.worker.execute(fn, per_rank[0], kwargs)])
        except Exception as exc:  # raised again by collect, where a Ray group raises too
            return GroupCall(info, self.generation, [], exc)

    def collect(self, call: GroupCall) -> Any:
        if call.error is not None:
            raise call.error
        return gather(call.info, call.refs)

    def done(self, call: GroupCall) -> bool:
        return True

    def shutdown(self) -> None:
        """Drop the worker once its writes in flight (a snapshot copy) are done and its slots unpinned: none
        outlives the group in this process."""
        if self.worker is not None and self.worker.trainer is not None:
            self.worker.trainer.saver.close()
        self.worker = None

    def resize(self, spec: JobSpec) -> None:
        raise ValueError("the in-process backend runs one worker per role: resizing a role needs --backend ray")

    def endpoints(self) -> list[Any]:
        return [self.worker]


class RayWorkerGroup(WorkerGroup):
    """`world_size` Ray actors of one role in the role's own placement group (one bundle per rank), or, for
    a role that shares its GPUs (`kuberl.spec.colocation`), in its colocation set's group, asking 1/k of a GPU."""

    standby_capable = True  # separate processes: a second set can be kept warm (kuberl.resilience.standby)
    own_processes = True

    def __init__(self, role: str, spec: JobSpec, device: str = "auto", timeout_s: float | None = None,
                 ready_timeout_s: float | None = None, worker_cls: type[Worker] | None = None,
                 shared: SharedPlacement | None = None):
        """Timeouts default to spec.resilience.callTimeoutSeconds / startTimeoutSeconds. `shared`: the job's
        colocation placement groups, needed when the role shares its GPUs (one per job, for every group)."""
        self.role, self.spec, self.device = role, spec, device
        if shared is None and sharing(spec, role):
            raise ValueError(f"role {role} shares its GPUs ({', '.join(sharing(spec, role))}): give every "
                             f"RayWorkerGroup of the job one SharedPlacement(spec)")
        self.shared = shared if sharing(spec, role) else None
        self.worker_cls = worker_cls or worker_class(spec, role)
        self.world_size = world_size(spec, role)
        self.timeout_s = timeout_s or spec.resilience.call_timeout_seconds
        self.ready_timeout_s = ready_timeout_s or spec.resilience.start_timeout_seconds
        self.actors: list[Any] = []
        self.pg = None
        self.slowest: dict[str, float] = {}  # method -> slowest completed call on these ranks, seconds
        self.where: list[dict[str, Any]] = []  # each rank's identity (pid, Ray node), for a hang's diagnosis

    def bundle(self) -> dict[str, float]:
        """What one rank's actor asks for: its CPUs, its share of a GPU, one unit of its role resource."""
        out = {"CPU": rank_cpus(self.spec, self.role), role_resource(self.role): 1.0}
        if self.spec.roles.get(self.role).gpus:
            out["GPU"] = gpu_share(self.spec, self.role)
        return out

    def concurrency(self) -> int:
        """Calls one rank runs at once: under spec.rollout.asynchronous the actor generates beside its update; an env
        rank answers spec.environment.concurrency environment calls, and the driver's check beside them."""
        if self.role == "env" and self.spec.environment is not None:
            return self.spec.environment.concurrency + 1
        return 2 if self.role == "actor" and self.spec.rollout.asynchronous else 1

    def endpoints(self) -> list[Any]:
        return list(self.actors)

    def launch(self) -> None:
        """Reserve the placement group and create the actors without waiting (processes start in the background)."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = self.bundle()
        if (link := ownlink.current()) is not None:  # a group reserved for a job Ray ended is never removed
            link.abandon_if_declared_dead()
        if self.shared is not None:
            self.pg = self.shared.acquire(self.role, self.world_size)
        else:
            name = f"kuberl-{self.role}-{os.getpid()}-{time.time_ns()}"
            self.pg = placement_group([bundle] * self.world_size, strategy="PACK", name=name)
        cls = ray.remote(concurrency_groups={hangs.CONTROL: 2})(self.worker_cls)
        spec_json = self.spec.model_dump_json(by_alias=True)
        # GPU ranks see every GPU of their node and pin themselves by topology (kuberl.topology.placement);
        # NCCL's flight recorder names the collective and the rank of a collective that timed out.
        # A log level or format other than the default reaches the actors wherever they run (kuberl.logs).
        env_vars = logs.environ()
        if "GPU" in bundle:
            env_vars |= {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                         **NCCL_FLIGHT_RECORDER}
        env = {"env_vars": env_vars} if env_vars else None
        custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
        self.actors = [
            cls.options(
                num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0), resources=custom,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=rank),
                max_restarts=0, runtime_env=env, max_concurrency=self.concurrency(),
            ).remote(spec_json, self.role, rank, self.world_size, self.device, max(1, int(bundle["CPU"])))
            for rank in range(self.world_size)
        ]

    def wait_ready(self) -> None:
        """Wait for capacity (the placement group), then join the ranks' process group and set up models."""
        import ray

        try:
            ray.get(self.pg.ready(), timeout=self.ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise WorkerFailure(self.role, Reason.WORKER_FAILURE,
                                f"no capacity for {self.world_size} x {self.bundle()} within "
                                f"{self.ready_timeout_s:.0f}s (spec.resilience.startTimeoutSeconds)") from None
        up = max(self.ready_timeout_s, self.timeout_s)
        addr, port = self._get([self.actors[0].rendezvous.remote()], up)[0]
        nodes = self._get([a.node_gpus.remote() for a in self.actors], up)
        self._get([a.init.remote(addr, port, *local) for a, local in zip(self.actors, local_ranks(nodes))], up)
        self.where = self._get([a.identity.remote() for a in self.actors], up)
        self.generation += 1

    def _task_failure(self, cause: BaseException) -> WorkerFailure | RoleError:
        """What a rank's raised error means: a dead peer or a failed collective is a WorkerFailure (restart),
        an error of the role's code with every rank alive a RoleError."""
        text = error_text(cause)
        error = f"{type(cause).__name__}: {text}"
        if not self._all_alive():
            return WorkerFailure(self.role, Reason.WORKER_DIED, f"a rank died ({type(cause).__name__} on a peer: "
                                 f"{text})", error=error)
        if hangs.collective_failed(cause):
            reason, summary, _ = self.diagnose()
            return WorkerFailure(self.role, reason, f"a collective failed ({error}); {summary}", summary, error)
        log_text = str(cause).strip().splitlines()[-1] if str(cause).strip() else ""
        return RoleError(self.role, f"{type(cause).__name__}: {log_text}", error)

    def _get(self, refs: list[Any], timeout: float | None = None, why: str = "") -> list[Any]:
        """Results in rank order. The first rank to fail decides: a dead process (or a peer's error
        while another rank is dead, e.g. a broken collective) is a WorkerFailure, and so is a
        torch.distributed error (a collective that timed out on a hung peer); another exception
        raised by the role's code with every rank alive is a RoleError (deterministic: no restart).
        A timeout is a hang: the ranks' stacks are logged and summarised before it is raised."""
        import ray

        timeout = timeout or self.timeout_s
        deadline, pending = time.monotonic() + timeout, list(refs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    self._unless_driver_cut_off()
                    reason, summary, idle = self.diagnose()
                    detail = f"no answer within {timeout:.0f}s ({why or 'spec.resilience.callTimeoutSeconds'})"
                    if idle:  # it ran, or never arrived; its answer is lost on the way (a broken link)
                        raise LinkBroken(self.role, f"unreachable: {detail}, and every rank is alive and in no call: "
                                                    f"the call or its answer was lost on the way")
                    raise WorkerFailure(self.role, reason, f"hung: {detail}; {summary}", summary)
                ray.get(ready[0])  # raises this rank's error now, not after slower ranks
            return ray.get(refs)
        except ray.exceptions.RayTaskError as exc:
            raise self._task_failure(exc.cause if getattr(exc, "cause", None) is not None else exc) from None
        except ray.exceptions.OutOfMemoryError as exc:  # Ray's memory monitor killed the rank near its memory limit
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise WorkerFailure(self.role, Reason.WORKER_DIED, f"worker killed for memory ({first}); if it recurs, "
                                f"give spec.{self.spec.roles.path(self.role)}.resources.memory more") from None
        except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError,
                ray.exceptions.ActorUnavailableError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self._unless_driver_cut_off()
            if isinstance(exc, ray.exceptions.ActorUnavailableError) and self._all_alive():
                raise LinkBroken(self.role, f"unreachable: the connection to a rank broke during the call, and the "
                                 f"rank is alive ({first}); the call may or may not have run") from None
            if hangs.node_unreachable(str(exc)):
                raise WorkerFailure(self.role, Reason.WORKER_UNREACHABLE, f"unreachable: Ray marked the node of a rank "
                                    f"dead after it missed its health checks ({first})") from None
            raise WorkerFailure(self.role, Reason.WORKER_DIED, f"worker died ({type(exc).__name__}: {first})") from None

    def _unless_driver_cut_off(self) -> None:
        """Raise LinkBroken when the silence was this driver's own cut (`kuberl.resilience.ownlink`: it could not reach
        the Ray head) and every rank answers once the link is back; return, to blame the role, otherwise."""
        link = ownlink.current()
        waited = link.wait_if_cut_off() if link is not None else None
        if waited is not None and self._all_alive():
            raise LinkBroken(self.role, f"unreachable: this driver was cut off from the Ray head for {waited:.0f}s "
                                        f"and every rank is alive: the call or its answer was lost on the way")

    def diagnose(self, timeout_s: float = 5.0, probe_s: float = 10.0) -> tuple[Reason, str, bool]:
        """Every rank's Python stacks (all threads) into the driver's log, and for a rank that did not answer, its
        process's state as its node reads it (`probe_s` to answer); returns the cause (WorkerUnreachable when a
        silent rank's node did not answer either, else WorkerHung), the one-line summary, and whether every rank
        answered and is in no call (idle: the call awaited is not running anywhere)."""
        import ray

        stacks: dict[int, list[hangs.Frame] | None] = {}
        absent: dict[int, tuple[str, str]] = {}
        for rank, actor in enumerate(self.actors):
            try:
                dump = ray.get(actor.dump_stacks.options(concurrency_group=hangs.CONTROL).remote(), timeout=timeout_s)
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as exc:
                log.info(f"role {self.role} rank {rank}: no stack dump ({type(exc).__name__})",
                         extra={"role": self.role, "rank": rank})
                stacks[rank] = None
                if rank < len(self.where) and self.where[rank].get("node"):
                    pid = self.where[rank]["pid"]
                    absent[rank] = hangs.absent_cause(self._process_state(rank, probe_s), pid, timeout_s + probe_s)
                continue
            log.info(f"role {self.role} rank {rank} stacks before it is killed:\n{dump['text']}",
                     extra={"role": self.role, "rank": rank})
            stacks[rank] = [tuple(f) for f in dump["call"]]
        summary = hangs.summarize(self.role, stacks, absent)
        log.info(summary, extra={"role": self.role})
        unreachable = any(kind == "unreachable" for kind, _ in absent.values())
        idle = all(frames is not None and hangs.where(frames)[0] == "idle" for frames in stacks.values())
        return (Reason.WORKER_UNREACHABLE if unreachable else Reason.WORKER_HUNG), summary, idle

    def _process_state(self, rank: int, timeout_s: float) -> str | None:
        """The state of rank `rank`'s process, read by a task on its node (`hangs.process_state`); None when the
        node does not answer within `timeout_s` or is gone."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        where = self.where[rank]
        probe = ray.remote(num_cpus=0, max_retries=0)(hangs.process_state).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(where["node"], soft=False))
        ref = probe.remote(where["pid"])
        try:
            return ray.get(ref, timeout=timeout_s)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            ray.cancel(ref, force=True)
            return None

    def _all_alive(self, timeout_s: float = 10.0) -> bool:
        """Every rank answers the identity ping (a control call: it answers beside a stuck call)."""
        import ray

        try:
            ray.get([a.identity.options(concurrency_group=hangs.CONTROL).remote() for a in self.actors],
                    timeout=timeout_s)
            return True
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return False

    def _submit(self, fn, info, per_rank, kwargs, fault):
        """Start on every rank; an injected fault hits the last rank (rank 0 of a one-rank group)."""
        last = self.world_size - 1
        group = {"concurrency_group": hangs.CONTROL} if info.control else {}
        refs = [actor.execute.options(**group).remote(fn, args, kwargs, fault if rank == last else None)
                for rank, (actor, args) in enumerate(zip(self.actors, per_rank))]
        return GroupCall(info, self.generation, refs)

    def collect(self, call: GroupCall) -> Any:
        """Gather `call`, which counts as hung past its method's `hangs.hang_timeout`."""
        slowest = self.slowest.get(call.name)
        timeout = hangs.hang_timeout(slowest, self.timeout_s)
        why = ("spec.resilience.callTimeoutSeconds" if timeout == self.timeout_s else
               f"{hangs.HANG_FACTOR:g} x its slowest call {slowest:.2f}s, at least {hangs.HANG_FLOOR_S:g}s")
        out = gather(call.info, self._get(call.refs, timeout, why))
        # control calls too: a rank stopped while the step's end awaits its memory peak is hung after 30 s, not
        # after callTimeoutSeconds
        self.slowest[call.name] = max(slowest or 0.0, time.perf_counter() - call.sent_at)
        return out

    def done(self, call: GroupCall) -> bool:
        import ray

        ready, _ = ray.wait(call.refs, num_returns=len(call.refs), timeout=0)
        return len(ready) == len(call.refs)

    def identities(self) -> list[dict[str, Any]]:
        ids = super().identities()
        for ident, actor in zip(ids, self.actors):
            ident["actor_id"] = actor._actor_id.hex()
        return ids

    def shutdown(self) -> None:
        """Kill this role's actors and release its placement group (a shared one stays while another role of
        its colocation set holds it); other roles are untouched."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        if self.pg is not None and self.shared is not None:
            self.shared.release(self.role)
        elif self.pg is not None:
            remove_placement_group(self.pg)
        self.pg = None



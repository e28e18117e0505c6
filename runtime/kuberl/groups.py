"""WorkerGroups: N workers of one role behind one interface, on Ray or in-process.

`call(method, batch)` splits the batch into equal contiguous shards, one per rank, runs the method on
every rank, and gathers the results (Batches are concatenated in rank order; other results come back
as a per-rank list). A dead or hung rank surfaces as `WorkerFailure(role, reason)`.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from typing import Any, Optional

from .batch import Batch
from .spec import JobSpec, role_resource
from .spec.contract import Reason
from .workers import WORKERS



class WorkerFailure(RuntimeError):
    """A role's worker died or stopped answering: `reason` is the code, `detail` says what happened."""

    def __init__(self, role: str, reason: Reason, detail: str):
        super().__init__(f"role {role}: {detail}")
        self.role, self.reason, self.detail = role, reason, detail


class RoleError(RuntimeError):
    """A role's code raised (e.g. a reward function's bug): deterministic, so not worth a restart."""

    reason = Reason.ROLE_ERROR

    def __init__(self, role: str, error: str):
        super().__init__(f"role {role} raised {error}")
        self.role = role


def world_size(spec: JobSpec, role: str) -> int:
    """Ranks of a role: one per GPU (replicas x GPUs per replica), or one per replica on CPU."""
    rs = getattr(spec.roles, role)
    return rs.replicas * max(rs.gpus, 1)


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


def _gather(results: list[Any]) -> Any:
    return Batch.concat(results) if results and isinstance(results[0], Batch) else results


class WorkerGroup(ABC):
    role: str
    world_size: int

    def call(self, method: str, batch: Optional[Batch] = None, fault: Optional[str] = None, **kwargs: Any) -> Any:
        shards = batch.split(self.world_size) if batch is not None else [None] * self.world_size
        return _gather(self._run(method, shards, kwargs, fault))

    @abstractmethod
    def _run(self, method: str, shards: list[Optional[Batch]], kwargs: dict, fault: Optional[str]) -> list[Any]: ...

    def start(self) -> None:
        """Launch and wait until every rank is set up."""
        self.launch()
        self.wait_ready()

    @abstractmethod
    def launch(self) -> None:
        """Begin creating the workers; `wait_ready` completes it (lets roles start in parallel)."""

    @abstractmethod
    def wait_ready(self) -> None: ...

    @abstractmethod
    def shutdown(self) -> None: ...

    def identities(self) -> list[dict[str, Any]]:
        return self.call("identity")


class LocalWorkerGroup(WorkerGroup):
    """One in-process worker (world size 1), no Ray: the GPU benchmark path. Faults are not supported."""

    def __init__(self, role: str, spec: JobSpec, device: str = "auto"):
        self.role, self.spec, self.device, self.world_size = role, spec, device, 1
        self.worker = None

    def launch(self) -> None:
        """In-process: nothing to launch ahead of time."""

    def wait_ready(self) -> None:
        from . import dist as kdist

        self.worker = WORKERS[self.role](self.spec.model_dump_json(by_alias=True), 0, 1, self.device)
        addr = "127.0.0.1"
        self.worker.init(addr, 0 if kdist.dist.is_initialized() else kdist.free_port(addr))

    def _run(self, method, shards, kwargs, fault):
        if fault:
            raise ValueError("fault injection needs separate worker processes: use the ray backend")
        return [self.worker.execute(method, shards[0], kwargs)]

    def shutdown(self) -> None:
        self.worker = None


class RayWorkerGroup(WorkerGroup):
    """`world_size` Ray actors of one role in the role's own placement group (one bundle per rank)."""

    def __init__(self, role: str, spec: JobSpec, device: str = "auto", timeout_s: Optional[float] = None,
                 ready_timeout_s: Optional[float] = None):
        """Timeouts default to spec.resilience.callTimeoutSeconds / startTimeoutSeconds."""
        self.role, self.spec, self.device = role, spec, device
        self.world_size = world_size(spec, role)
        self.timeout_s = timeout_s or spec.resilience.call_timeout_seconds
        self.ready_timeout_s = ready_timeout_s or spec.resilience.start_timeout_seconds
        self.actors: list[Any] = []
        self.pg = None

    def bundle(self) -> dict[str, float]:
        rs = getattr(self.spec.roles, self.role)
        cpus = rs.resources.cpu_cores() / max(rs.gpus, 1)
        out = {"CPU": cpus, role_resource(self.role): 1.0}
        if rs.gpus:
            out["GPU"] = 1.0
        return out

    def launch(self) -> None:
        """Reserve the placement group and create the actors without waiting (processes start in the background)."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = self.bundle()
        self.pg = placement_group([bundle] * self.world_size, strategy="PACK", name=f"kuberl-{self.role}-{os.getpid()}-{time.time_ns()}")
        cls = ray.remote(WORKERS[self.role])
        spec_json = self.spec.model_dump_json(by_alias=True)
        # GPU ranks see every GPU of their node and pin themselves by topology (kuberl.placement).
        env = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}} if "GPU" in bundle else None
        self.actors = [
            cls.options(
                num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0), resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=rank),
                max_restarts=0, runtime_env=env,
            ).remote(spec_json, rank, self.world_size, self.device, max(1, int(bundle["CPU"])))
            for rank in range(self.world_size)
        ]

    def wait_ready(self) -> None:
        """Wait for capacity (the placement group), then join the ranks' process group and set up models."""
        import ray

        try:
            ray.get(self.pg.ready(), timeout=self.ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise WorkerFailure(self.role, Reason.WORKER_FAILURE, f"no capacity for {self.world_size} x {self.bundle()} within {self.ready_timeout_s:.0f}s "
                                           "(spec.resilience.startTimeoutSeconds)") from None
        up = max(self.ready_timeout_s, self.timeout_s)
        addr, port = self._get([self.actors[0].rendezvous.remote()], up)[0]
        nodes = self._get([a.node_gpus.remote() for a in self.actors], up)
        self._get([a.init.remote(addr, port, *local) for a, local in zip(self.actors, local_ranks(nodes))], up)

    def _get(self, refs: list[Any], timeout: Optional[float] = None) -> list[Any]:
        """Results in rank order. The first rank to fail decides: a dead process (or a peer's error
        while another rank is dead, e.g. a broken collective) is a WorkerFailure; an exception raised
        by the role's code with every rank alive is a RoleError (deterministic: no restart)."""
        import ray

        timeout = timeout or self.timeout_s
        deadline, pending = time.monotonic() + timeout, list(refs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    raise WorkerFailure(self.role, Reason.WORKER_HUNG, f"hung: no answer within {timeout:.0f}s (spec.resilience.callTimeoutSeconds)")
                ray.get(ready[0])  # raises this rank's error now, not after slower ranks
            return ray.get(refs)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            text = str(cause).strip().splitlines()[-1] if str(cause).strip() else ""
            if not self._all_alive():
                raise WorkerFailure(self.role, Reason.WORKER_DIED, f"a rank died ({type(cause).__name__} on a peer: {text})") from None
            raise RoleError(self.role, f"{type(cause).__name__}: {text}") from None
        except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise WorkerFailure(self.role, Reason.WORKER_DIED, f"worker died ({type(exc).__name__}: {first})") from None

    def _all_alive(self, timeout_s: float = 10.0) -> bool:
        import ray

        try:
            ray.get([a.identity.remote() for a in self.actors], timeout=timeout_s)
            return True
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return False

    def _run(self, method, shards, kwargs, fault):
        """Run on every rank; an injected fault hits the last rank (rank 0 of a one-rank group)."""
        last = self.world_size - 1
        refs = [a.execute.remote(method, shard, kwargs, fault if rank == last else None) for rank, (a, shard) in enumerate(zip(self.actors, shards))]
        return self._get(refs)

    def identities(self) -> list[dict[str, Any]]:
        ids = super().identities()
        for ident, actor in zip(ids, self.actors):
            ident["actor_id"] = actor._actor_id.hex()
        return ids

    def shutdown(self) -> None:
        """Kill this role's actors and release its placement group; other roles are untouched."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None


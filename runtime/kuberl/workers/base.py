"""The base of every role worker: one rank of one role, in its own process (a Ray actor) or in-process.

The driver reaches a worker only through `execute(fn, args, kwargs, fault)`, where `fn` is one of the
worker's methods declared with `@register(Dispatch...)` (typed proxies in `kuberl.controller.proxies` name
them); the fault hook kills the process for real (SIGKILL) or hangs it, for fault-injection tests
and demos.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from kuberl import logs
from kuberl.data.batch import Batch
from kuberl.resilience import hangs, saves, snapshots
from kuberl.spec import JobSpec, RoleSpec
from kuberl.spec.colocation import sharing
from kuberl.spec.contract import Env
from kuberl.topology.placement import pin_rank
from kuberl.training import dist as kdist
from kuberl.training import gcfreeze
from kuberl.training.idle import Resident
from kuberl.training.kernels import KernelOptions
from kuberl.training.micro import micro_rows
from kuberl.training.models import count_params, load_tokenizer
from kuberl.training.trainer import FSDPTrainer
from kuberl.workers.dispatch import Dispatch, method_info, register

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SLOW_WRITE_S = 30.0  # how long the "slow" fault holds a checkpoint write (and its snapshot slot) back
FOLLOW_WAIT_S = 60.0  # how long a standby waits for its role's snapshot copy of a step to be whole


class Worker:
    """One rank of a role. Subclasses implement `setup()` and their phase methods, each declared with
    `@register(Dispatch...)`. `role` is the role's name in the spec (an extra role's class may serve
    any name)."""

    trainer: FSDPTrainer | None = None
    resident: Resident | None = None  # set when the role shares its GPUs (kuberl.training.idle)
    _call_thread: int | None = None  # the thread running the driver's current (non-control) call

    def __init__(self, spec_json: str, role: str, rank: int, world_size: int, device: str = "auto", threads: int = 0,
                 kernels: KernelOptions | None = None):
        """`kernels` defaults to what a job uses on this worker's device (`KernelOptions.for_device`)."""
        logs.setup_from_env()  # a Ray actor is a process of its own: the driver's log level and format
        self.spec = JobSpec.model_validate_json(spec_json)
        self.role, self.rank, self.world_size = role, rank, world_size
        self.role_spec: RoleSpec = self.spec.roles.get(role)
        self.device = kdist.pick_device(self.role_spec.gpus, device)
        self.kernels = kernels or KernelOptions.for_device(self.device)
        self.dtype = DTYPES[self.spec.model.dtype] if self.device.type == "cuda" else torch.float32
        if threads > 0:
            torch.set_num_threads(threads)
        self.tokenizer = load_tokenizer(self.spec.model)
        self._promoted = threading.Event()  # set: this standby took its role's place (it follows no more)
        # one call of a method at a time: a call sent again while the first still runs (the link broke, not the
        # call) waits for it, so an update sent twice finds itself applied (two methods may still overlap)
        self._running: dict[str, threading.Lock] = {}  # method name -> its lock (setdefault: atomic)

    # -- lifecycle, called by the WorkerGroup ------------------------------------------------------
    @register(Dispatch.ALL, faults=False, control=True)
    def identity(self) -> dict[str, Any]:
        """The liveness ping: answers while another call is stuck (the control concurrency group). `node`: this
        process's Ray node id ("" outside Ray), where a hang's diagnosis looks at it from
        (`kuberl.resilience.hangs`)."""
        ray = _ray()
        node = ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else ""
        return {"role": self.role, "rank": self.rank, "pid": os.getpid(), "node": node}

    def micro_batches(self, batch: Batch) -> list[torch.Tensor]:
        """This rank's micro-batches of `batch`, as row indices (spec.trainer's microBatchSize or
        maxTokensPerMicroBatch; `kuberl.training.micro`)."""
        tr = self.spec.trainer
        return micro_rows(batch, tr.micro_batch_size, tr.max_tokens_per_micro_batch)

    @register(Dispatch.ALL, faults=False, control=True)
    def dump_stacks(self) -> dict[str, Any]:
        """Every thread's Python stack, and the frames of the call in progress
        (`kuberl.resilience.hangs.capture_stacks`)."""
        return hangs.capture_stacks(self._call_thread)

    @register(Dispatch.ALL, state=False, repeatable=True)
    def placement_info(self) -> dict[str, Any]:
        """This rank's GPU, the worst link inside the role's groups and where the links were read (None on CPU);
        its host's name (in a cluster: its pod's); under Ray also its node, placement group and what Ray reserved
        for it (`ray` is None outside Ray)."""
        p = self.placement
        return {"device": None if p is None else p.device, "worst_link": None if p is None else p.worst_link,
                "topology_source": None if p is None else p.topology_source, "host": socket.gethostname(),
                "ray": _ray_placement()}

    @register(Dispatch.ONE, state=False, repeatable=True)
    def measure_peak_flops(self) -> float:
        """Dense matmul FLOP/s on this worker's device and dtype (the MFU denominator)."""
        return kdist.measure_matmul_flops(self.device, self.dtype)

    @register(Dispatch.ONE, control=True)
    def memory(self) -> dict[str, int]:
        """This process's peak GPU memory and peak resident set size, in bytes (GPU 0 on CPU); rank 0's."""
        import resource

        gpu = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else 0
        return {"gpu_peak": int(gpu), "rss_peak": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}

    @register(Dispatch.ALL, faults=False, state=False, repeatable=True)
    def settle(self) -> bool:
        """After this process's first step: its long-lived objects out of the cycle collector's way, once
        (`kuberl.training.gcfreeze`). Returns whether this call did it."""
        return gcfreeze.settle()

    @register(Dispatch.ONE, state=False, repeatable=True)
    def num_params(self) -> int:
        return count_params(self.trainer.model) if self.trainer is not None else 0

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0: the address and port of the group's torch.distributed store, listening on this pod's or
        host's own address only (127.0.0.1 locally); kept open until `init` hands it to the store."""
        host = os.environ.get(Env.NODE_IP) or _ray_node_ip() or "127.0.0.1"
        self._listen = kdist.listener(host)
        return host, self._listen.getsockname()[1]

    def node_gpus(self) -> tuple[str, list[int]]:
        """(Ray node id, GPU indices Ray reserved for this actor); ([], '') outside Ray or on CPU."""
        ray = _ray()
        if ray is None or not ray.is_initialized() or self.device.type != "cuda":
            return "", []
        return ray.get_runtime_context().get_node_id(), [int(g) for g in ray.get_gpu_ids()]

    def init(self, addr: str, port: int, local_rank: int = 0, node_gpus: list[int] | None = None) -> None:
        """Pin to a GPU by topology (when this rank shares a node's GPUs with its group), then join
        the role's process group and build the models."""
        self.placement = None
        if self.device.type == "cuda" and node_gpus:
            self.placement = pin_rank(self.spec, self.role, local_rank, node_gpus)
            os.environ["NCCL_P2P_LEVEL"] = self.placement.nccl_p2p_level
            self.device = torch.device("cuda", self.placement.device)
            torch.cuda.set_device(self.device)
        kdist.init_group(self.rank, self.world_size, addr, port, self.device, getattr(self, "_listen", None),
                         hangs.collective_timeout(self.spec.resilience.call_timeout_seconds))
        self.setup()
        self.resident = self._resident() if sharing(self.spec, self.role) else None
        if self.resident is not None:
            self.resident.sleep()

    def resident_modules(self) -> list[torch.nn.Module]:
        """The modules this role keeps on its device between phases (offloaded while it shares its GPUs)."""
        return [self.trainer.model] if self.trainer is not None else []

    def _resident(self) -> Resident:
        off = self.role_spec.offload
        return Resident(self.device, self.role_spec.idle_memory == "offload", self.resident_modules(),
                        self.trainer.optimizer if self.trainer is not None else None, off.params,
                        off.params or off.optimizer)

    def setup(self) -> None:
        raise NotImplementedError

    @register(Dispatch.ONE)
    def save(self, path: str) -> int | None:
        """Start checkpointing trainable state (actor, critic) to `path`, written in the background
        (`commit_saves` completes it); returns the trained step of the state saved. Frozen roles have none.
        Injected faults hit it only when aimed at the checkpoint phase."""
        return self.trainer.save(path) if self.trainer is not None else None

    @register(Dispatch.ALL, faults=False, state=False, repeatable=True)
    def has_checkpoint(self, path: str) -> bool:
        """Whether this rank sees a complete DCP checkpoint at `path` (not so on per-pod storage)."""
        return saves.complete(path)

    @register(Dispatch.ONE, faults=False)
    def load(self, path: str, step: int) -> None:
        """Load the state of trained step `step` from a checkpoint folder."""
        if self.trainer is not None:
            self.trainer.load(path, step)
            self.restored()

    @register(Dispatch.ONE, faults=False)
    def load_snapshot(self, step: int) -> bool:
        """Load each rank's own snapshot of trained step `step` (after `enable_snapshots`). Returns False
        when rank 0 held that state already (a warm standby that followed the snapshots) and copied nothing."""
        if self.trainer is None:
            return False
        loaded = self.trainer.load_snapshot(step)
        self.restored()
        return loaded

    @register(Dispatch.ALL, faults=False)
    def follow_snapshot(self, root: str, step: int) -> float:
        """A warm standby keeping up with its role: load this rank's snapshot of trained step `step` under
        `root` (no collective), so that a take-over finds it loaded. The role may still be copying it: this
        waits for it to be whole, until a newer step is (the role skipped this one: `saves.snapshot_plan`),
        `stop_following` (a take-over) or `FOLLOW_WAIT_S`. A step older than the state held, or one already
        pruned, is skipped. Returns the seconds it took."""
        t0 = time.perf_counter()
        if self.trainer is not None and not self._promoted.is_set():
            self.trainer.saver.snapshot_root = root
            while (max(snapshots.whole_steps(root, self.rank), default=0) < step
                   and time.perf_counter() - t0 < FOLLOW_WAIT_S):
                if self._promoted.wait(0.005):
                    return time.perf_counter() - t0
            with contextlib.suppress(FileNotFoundError):
                self.trainer.load_snapshot(step, newer_only=True)
        return time.perf_counter() - t0

    @register(Dispatch.ALL, faults=False, control=True)
    def stop_following(self) -> None:
        """A standby taking its role's place: a `follow_snapshot` waiting for a snapshot (which its role may
        have died before finishing) returns now, and later ones (sent before) do nothing."""
        self._promoted.set()

    @register(Dispatch.ONE, faults=False)
    def reapplied(self) -> None:
        """An update was run again on restored state (`kuberl.library.Roles.recover`): as after a load."""
        self.restored()

    def restored(self) -> None:
        """Called after the trainable state was loaded (the actor refreshes its rollout engine)."""

    @register(Dispatch.ALL, faults=False, state=False)
    def enable_snapshots(self, root: str) -> None:
        """Snapshot the trainable state after every update under `root` (kuberl.resilience.saves)."""
        if self.trainer is not None:
            self.trainer.enable_snapshots(root)

    @register(Dispatch.ALL, faults=False, state=False, repeatable=True)
    def newest_snapshot(self, root: str) -> int | None:
        """The newest step whose snapshot of this rank is whole under `root`."""
        return snapshots.newest(root, self.rank)

    @register(Dispatch.ALL, faults=False, state=False)
    def commit_saves(self, snapshots: bool = True) -> None:
        """Wait for this rank's checkpoint writes in flight and, with `snapshots`, its snapshot copy."""
        if self.trainer is not None:
            self.trainer.saver.wait(snapshots)

    @register(Dispatch.ALL, faults=False, state=False, repeatable=True)
    def saves_pending(self) -> bool:
        """Whether a checkpoint write of this rank is still in flight (`commit_saves` would wait)."""
        return self.trainer is not None and self.trainer.saver.pending()

    def execute(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                fault: str | None = None) -> Any:
        """Run the role method `fn` on this rank (this worker's own override of it, if it has one),
        Batches moved to the device first; `fault` = "kill" ends this process now, "hang" stops
        answering, "stop" stops this process (SIGSTOP: nothing in it runs, not even its stack dump),
        "kill_in_snapshot" runs the call (an update) and kills the process at its next call, the
        update's snapshot never finished; "slow" runs the call (a save), its checkpoint write held back
        SLOW_WRITE_S (a disk slower than the steps)."""
        info = method_info(fn)  # only declared role methods are callable from the driver
        if not info.control:
            self._call_thread = threading.get_ident()
        if fault == "kill" or (not info.control and self.trainer is not None and self.trainer.saver.doomed):
            os.kill(os.getpid(), signal.SIGKILL)
        self._arm(fault)
        if fault == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if fault == "hang":
            while True:
                time.sleep(3600)
        bound = getattr(self, fn.__name__)  # virtual: a subclass's override runs, as in a plain call
        # a role that shares its GPUs: its state back on the device for a call that needs it (kuberl.training.idle),
        # and after every call (what a bookkeeping call allocated too) its idle memory given back
        resident = None if info.control else self.resident
        if resident is not None and info.state:
            resident.wake()
        try:
            with contextlib.nullcontext() if info.control else self._running.setdefault(fn.__name__, threading.Lock()):
                return bound(*(a.to(self.device) if isinstance(a, Batch) else a for a in args), **kwargs)
        finally:
            if resident is not None:
                if self.trainer is not None:
                    self.trainer.saver.wait_snapshots()  # the copy reads the tensors that sleep moves
                resident.sleep()

    def _arm(self, fault: str | None) -> None:
        """The faults of `execute` that hit the writes the call starts: its snapshot, its checkpoint."""
        if fault == "kill_in_snapshot" and self.trainer is not None:
            self.trainer.saver.doom_next = True
        if fault == "slow" and self.trainer is not None:
            self.trainer.saver.slow_next = SLOW_WRITE_S


def _ray() -> Any:
    """The ray module when this process already uses Ray (a Ray actor or driver), else None. Never imports
    it: importing reads Ray's settings (auth mode, ...) from the environment, which a process that later
    starts a local Ray sets first (`kuberl.run.quiet_local_ray`)."""
    return sys.modules.get("ray")


def _ray_node_ip() -> str | None:
    ray = _ray()
    return ray.util.get_node_ip_address() if ray is not None and ray.is_initialized() else None


def _ray_placement() -> dict[str, Any] | None:
    """This actor's Ray node id, placement group id, assigned resources ({"GPU": 0.5, ...}) and GPU ids; None
    when this worker is not a Ray actor (in-process, even in a process that runs a Ray driver)."""
    ray = _ray()
    if ray is None or not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return None
    ctx = ray.get_runtime_context()
    return {"node": ctx.get_node_id(), "placement_group": ctx.get_placement_group_id(),
            "resources": ctx.get_assigned_resources(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

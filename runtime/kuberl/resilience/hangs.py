"""Hung calls: how long a call may take before it counts as hung, and what the hung ranks were doing.

The hang timeout of a call is `HANG_FACTOR` x the slowest completed call of the same method on the
same group of ranks, at least `HANG_FLOOR_S`, at most `spec.resilience.callTimeoutSeconds` (the
ceiling, and the only bound for a method not yet seen). Before a hung role is killed, every rank
dumps the Python stacks of all its threads (`capture_stacks`, run in the workers' `CONTROL` Ray
concurrency group, so it answers beside the stuck call); the driver logs them all and
`summarize` turns them into one line (role, rank, innermost frame, collective or user code) for
the recovery record and the operator's `lastFailure`. A rank whose collective failed while its
peers are alive (`collective_failed`) makes the role count as hung too, not as a bug in its code.

A rank that does not answer its dump is looked at from its node: a task there reads its process's
state (`process_state`). `absent_cause` names what that shows: a stopped process (SIGSTOP, a
debugger), a process gone, one that runs but does not answer, or, when the node does not answer
either, an unreachable rank (a network partition, a lost node). Ray's own verdict on a node that
missed its health checks (`node_unreachable`) names the same cause.
"""

from __future__ import annotations

import re
import sys
import threading
import traceback
from typing import Any

CONTROL = "control"  # the Ray concurrency group of control methods (ping, memory, stack dump)
HANG_FACTOR = 10.0
HANG_FLOOR_S = 30.0
COLLECTIVE_PATH = "torch/distributed/"
# files whose frames are collectives (or waits on one): the c10d API (all_reduce, all_gather_into_tensor,
# barrier, ...), functional collectives, FSDP2's all-gather / reduce-scatter; not DTensor's CPU work
COLLECTIVE_FILES = ("distributed_c10d.py", "_functional_collectives.py", "_fsdp_collectives.py")
C10D_FILE = "distributed_c10d.py"
Frame = tuple[str, int, str]  # (file, line, function)
# gloo raises a plain RuntimeError when a collective times out or loses a peer (NCCL: a DistBackendError)
GLOO_ERROR = re.compile(r"gloo/transport/|Timed out waiting \d+ms for (recv|send) operation")


def hang_timeout(slowest_s: float | None, ceiling_s: float, factor: float = HANG_FACTOR,
                 floor_s: float = HANG_FLOOR_S) -> float:
    """Seconds a call may run: factor x the slowest such call so far, within [floor, ceiling];
    the ceiling when there is no history."""
    if slowest_s is None:
        return ceiling_s
    return min(ceiling_s, max(floor_s, factor * slowest_s))


def collective_timeout(call_timeout_s: float) -> float:
    """The process groups' timeout (`init_process_group(timeout=...)`): half the call timeout
    (`callTimeoutSeconds`), so that a collective waiting on a hung peer fails with the collective's own
    error (NCCL's flight recorder then names it and the missing rank) before the call's ceiling."""
    return call_timeout_s / 2


def collective_failed(exc: BaseException) -> bool:
    """Whether a rank's exception is a collective's failure (a timeout waiting on a hung peer, a lost
    peer), not the role's own bug: a torch.distributed error, or gloo's transport error."""
    import torch.distributed as dist

    return isinstance(exc, dist.DistError) or bool(GLOO_ERROR.search(str(exc)))


def process_state(pid: int) -> str:
    """The kernel's state of process `pid` on this node (`/proc/PID/status`: "S (sleeping)", "T (stopped)",
    ...); "gone" when there is no such process. Runs on the hung rank's node, as a Ray task."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("State:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "gone"


def absent_cause(state: str | None, pid: int, waited_s: float) -> tuple[str, str]:
    """(kind, text) for a rank that did not answer its stack dump, from its process's `state` as its node read it
    (`process_state`; None: the node did not answer within `waited_s` either). kind: unreachable, stopped,
    gone or unanswered. A process that sleeps (S: waiting, its control thread free to answer) and still does not
    answer is cut off from the driver: unreachable too (a cut that healed while the driver's connection to it did
    not). One running (R: a thread holding the GIL) or in uninterruptible I/O (D) is unanswered: hung."""
    if state is None:
        return "unreachable", (f"unreachable: neither the rank nor its node answered within {waited_s:.0f}s "
                               f"(a network partition, or a lost node)")
    if state == "gone":
        return "gone", f"gone: its process {pid} no longer exists on its node"
    if state[:1] in ("T", "t"):
        return "stopped", (f"stopped: its process {pid} is in state {state} (SIGSTOP, or a debugger), so it "
                           f"cannot dump its stacks")
    if state[:1] == "S":
        return "unreachable", (f"unreachable: its process {pid} waits on its node (state {state}) and does not "
                               f"answer: the driver's link to it is broken")
    return "unanswered", f"does not answer while its node does (process {pid} in state {state})"


def node_unreachable(text: str) -> bool:
    """Whether Ray's death message of an actor says its node failed its health checks (a partition, a node
    that stopped answering), not that the node or the process was ended."""
    return "health check failed" in text or "missing too many heartbeats" in text


def short_path(path: str) -> str:
    """A frame's file without the install prefix: torch/distributed/..., kuberl/workers/base.py."""
    for marker in ("site-packages/", "runtime/", "dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return path


def capture_stacks(call_thread: int | None) -> dict[str, Any]:
    """This process's Python stacks, all threads: {"text": readable dump, "call": the frames of the
    thread running the driver's call (outermost first), [] when none is running}."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts, call = [], []
    for ident, frame in sys._current_frames().items():
        stack = traceback.extract_stack(frame)
        mark = " (the driver's call)" if ident == call_thread else ""
        parts.append(f"thread {names.get(ident, ident)}{mark}:\n{''.join(traceback.format_list(stack))}")
        if ident == call_thread:
            call = [(short_path(f.filename), f.lineno or 0, f.name) for f in stack]
    return {"text": "\n".join(parts), "call": call}


def where(frames: list[Frame]) -> tuple[str, str]:
    """("collective", "all_reduce at torch/distributed/distributed_c10d.py:2870") when the call's stack
    is in a collective or waits on one (named by the innermost collective API frame), else ("user
    code", the innermost frame: also torch's own CPU work); ("idle", "") for no call."""
    if not frames:
        return "idle", ""
    dist = [f for f in frames if COLLECTIVE_PATH in f[0]
            and (f[0].endswith(COLLECTIVE_FILES) or f[2].startswith("wait"))]
    if dist:
        api = [f for f in dist if f[0].endswith(C10D_FILE)]
        file, line, fn = (api or dist)[-1]
        return "collective", f"{fn} at {file}:{line}"
    file, line, fn = frames[-1]
    return "user code", f"{fn} at {file}:{line}"


SUMMARY_ORDER = ("user code", "stopped", "unreachable", "gone", "collective", "unanswered", "idle")


def summarize(role: str, stacks: dict[int, list[Frame] | None],
              absent: dict[int, tuple[str, str]] | None = None) -> str:
    """One line for a hung role from each rank's call frames (None: the rank did not answer), and what its
    node showed of a rank that did not answer (`absent`: rank -> `absent_cause`).

    The culprit named first is a rank stuck in user code (its peers then wait in a collective), else a
    stopped, unreachable or vanished rank, else the first rank in a collective, else the first rank that
    did not answer."""
    absent = absent or {}
    kinds = {rank: where(frames) if frames is not None else absent.get(rank, ("unanswered", ""))
             for rank, frames in stacks.items()}
    rank, (kind, at) = min(kinds.items(), key=lambda kv: (SUMMARY_ORDER.index(kv[1][0]), kv[0]))
    head = f"role {role} rank {rank} hung"
    if stacks[rank] is None and rank in absent:
        head = f"role {role} rank {rank} {at}"
    elif at:
        head += f" in {kind}: {at}"
    elif kind == "unanswered":
        head += " (no stack: the rank did not answer the dump)"
    else:
        head = f"role {role}: no rank is still in the call"
    others = sorted(r for r, (k, _) in kinds.items() if r != rank and k == "collective")
    if others and kind != "collective":
        head += f"; rank(s) {','.join(map(str, others))} waiting in a collective"
    return head

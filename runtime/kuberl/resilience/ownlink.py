"""The driver's own link to its Ray cluster: whether it, rather than a role, is the one cut off.

From the driver, a role cut off from it and a driver cut off from everything look the same: calls that get no
answer. Before a role is blamed for silence, the driver checks its own link, the TCP port of the GCS on the
head. While that does not answer, the driver waits for it (`wait_if_cut_off`); once it answers again the calls
in flight are sent again, as after a short cut of a role.

Ray ends a node that missed its health checks: the driver's own raylet (its pod's, or `kuberl run`'s local
one) exits once the cut heals, and the driver, which can do nothing without it, would wait forever. So a
watch thread (`watch`) checks the raylet's Unix socket every few seconds and, when it is gone, ends the
process with `ExitCode.RAY_LOST`: the driver Job's next pod joins the cluster anew and resumes from the newest
complete checkpoint (a checkpoint marked complete is whole, whatever moment the exit comes at), and the retry
does not count against the Job's backoffLimit. A driver whose run raises while its raylet goes (Ray's client
raising on the new cluster's ID after the head's loss) exits the same way: `kuberl.run` asks `lost` and raises
`RayLost`.

The raylet hears of its node's death only some seconds after the link is back (22 s in a chaos run), and by then
the head has killed the roles' actors (their owner's node died) and ended the driver's job. A driver that blamed a
role meanwhile would restart it into a job Ray already cleaned up: the placement group it reserves is never removed,
holds the role's pod, and the next driver waits for that pod forever. So before any role is blamed, the driver asks
the head whether its own node is still alive (`declared_dead`), and exits `RAY_LOST` when it is not.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kuberl import logs
from kuberl.spec.contract import ExitCode

log = logs.get("resilience")
CHECK_S = 2.0  # seconds between two looks at the link while cut off, or at the raylet


class RayLost(RuntimeError):
    """The driver's Ray node is gone with its cluster: `kuberl run` exits `ExitCode.RAY_LOST`."""


def gcs_answers(address: str, timeout_s: float = 3.0) -> bool:
    """Whether a TCP connection to the GCS's `host:port` is accepted within `timeout_s`."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def raylet_alive(path: str, timeout_s: float = 3.0) -> bool:
    """Whether the raylet listens on its Unix socket `path`. Only a refused or missing socket says it is gone: a
    connection that times out (a raylet too busy to accept) counts as alive."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout_s)
        try:
            s.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:
            return True
    return True


def abandon(why: str) -> None:
    """End the driver at once with `ExitCode.RAY_LOST` (its Job retries it), saying why on stderr."""
    log.error(f"{why}; the driver exits {ExitCode.RAY_LOST.value} so that a new one resumes from the newest complete "
              f"checkpoint")
    sys.stdout.flush()
    os._exit(ExitCode.RAY_LOST)


def node_declared_dead(node_id: str, timeout_s: float = 5.0) -> bool:
    """Whether the head lists the Ray node `node_id` (hex) as dead (declared so after missed health checks, its raylet
    perhaps not told yet), or answers with another cluster's ID (the head restarted: the driver's cluster is gone).
    A head that cannot be asked otherwise says nothing: False. Asked through the worker's GCS client,
    which raises on an error: `ray.nodes()` aborts the process when the GCS restarted (a failed check in Ray's
    GlobalStateAccessor on `WrongClusterID`), which ended the driver at the head's loss in a chaos run."""
    import ray
    from ray.core.generated import gcs_pb2

    try:
        nodes = ray._private.worker.global_worker.gcs_client.get_all_node_info(timeout=timeout_s)
    except Exception as exc:  # no verdict, unless the GCS is another cluster's; the caller's own checks go on
        return "WrongClusterID" in str(exc)
    return any(key.hex() == node_id and info.state == gcs_pb2.GcsNodeInfo.DEAD for key, info in nodes.items())


def never() -> bool:
    return False


@dataclass
class OwnLink:
    """The driver's GCS address (`host:port`), its raylet's Unix socket, and how to ask the head whether the driver's
    node is declared dead (`node_declared_dead` for a Ray driver)."""

    gcs_address: str
    raylet_socket: str
    stopped: threading.Event = field(default_factory=threading.Event)  # set: the watch ends (Ray shuts down)
    declared_dead: Callable[[], bool] = never

    def wait_if_cut_off(self) -> float | None:
        """None when the GCS answers; else wait until it does and return the seconds waited. Should the driver's
        raylet go meanwhile, or the head have declared its node dead once the link is back, `abandon`: the roles'
        actors died with their owner's node, and nothing the driver starts now would be cleaned up."""
        waited = self._wait_for_link()
        self.abandon_if_declared_dead(waited)
        return waited

    def abandon_if_declared_dead(self, waited: float | None = None) -> None:
        """`abandon` when the head declared this driver's node dead (`waited`: the seconds it was cut off before):
        asked before a role is blamed, and before a role's placement group is reserved."""
        if self.declared_dead():
            abandon("this driver's Ray node is gone: the Ray head declared it dead, or restarted"
                    + (f" (it missed its health checks while cut off for {waited:.0f}s)" if waited is not None else "")
                    + ", and the roles' actors with it, so no role is blamed")

    def _wait_for_link(self) -> float | None:
        """None when the GCS answers; else the seconds until it does (`abandon` should the raylet go meanwhile)."""
        if gcs_answers(self.gcs_address):
            return None
        t0 = time.monotonic()
        log.info(f"this driver cannot reach the Ray head (GCS at {self.gcs_address}): it is the one cut off, so no "
                 f"role is blamed; waiting for the link")
        while not gcs_answers(self.gcs_address):
            if not raylet_alive(self.raylet_socket):
                abandon(f"this driver's Ray node ended while it was cut off from the head "
                        f"({time.monotonic() - t0:.0f}s)")
            time.sleep(CHECK_S)
        waited = time.monotonic() - t0
        log.info(f"the link to the Ray head is back after {waited:.0f}s")
        return waited

    def watch(self, interval_s: float = CHECK_S) -> threading.Thread:
        """A daemon thread that `abandon`s the driver once its raylet is gone (twice in a row, `interval_s` apart)."""
        def run() -> None:
            gone = 0
            while not self.stopped.wait(interval_s):
                gone = 0 if raylet_alive(self.raylet_socket) else gone + 1
                if gone >= 2:
                    abandon(f"this driver's Ray node is gone (its raylet no longer listens on {self.raylet_socket}): "
                            f"Ray ended it, or it crashed")

        thread = threading.Thread(target=run, name="kuberl-own-link", daemon=True)
        thread.start()
        return thread


_current: OwnLink | None = None


def start() -> OwnLink:
    """The link of this process's Ray driver (after `ray.init`), watched from now on; `current()` returns it."""
    import ray

    global _current
    node = ray._private.worker.global_worker.node
    node_id = ray.get_runtime_context().get_node_id()
    _current = OwnLink(node.gcs_address, node.raylet_socket_name, declared_dead=lambda: node_declared_dead(node_id))
    _current.watch()
    return _current


def stop() -> None:
    """End the watch before Ray shuts down (a local raylet that stops is no lost node)."""
    global _current
    if _current is not None:
        _current.stopped.set()
        _current = None


def lost(wait_s: float = 5.0) -> bool:
    """Whether this process is a Ray driver (`start` ran, `stop` not yet) whose raylet is gone, or goes within
    `wait_s` (it ends soon after the driver's own client sees its cluster gone): an error then is the cluster's
    loss, not a bug."""
    if _current is None:
        return False
    deadline = time.monotonic() + wait_s
    while raylet_alive(_current.raylet_socket):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def current() -> OwnLink | None:
    """The driver's link once `start` ran; None in a process that is no Ray driver (the local backend, a worker)."""
    return _current

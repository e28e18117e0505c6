"""Faults the way clusters break, injected from the host into one pod of the real node (root, as the node runs).

A pod's processes are found by its cgroup (`pod<uid>` under the node's own cgroup root, cgroup v1 with the
cgroupfs driver: `localkube.node`), and its network namespace through any of them (`nsenter -t PID -n`):

- `cut(pid)` / `heal(pid)`: an nftables table in the pod's own network namespace that drops every packet but
  loopback's, in and out: the pod is cut off from the head, the other roles and the API server;
- `slow(pid, delay_ms, loss)`: every packet the pod sends held back `delay_ms` and `loss` percent of them dropped,
  as `netem` would on its interface (this kernel has none: `tests/e2e/netem.py` does it through NFQUEUE);
- `freeze(pid)` / `thaw(pid)`: SIGSTOP and SIGCONT;
- `kill_containers(pids)`: SIGKILL every process of a pod but its sandbox's `pause`: its containers exit.

Every rule lives in the pod's namespace alone and goes with the pod; `heal` removes it before that.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from localkube.node import NodeState, cgroup_dirs

TABLE = "kuberl_chaos"


def pod_pids(state: Path, uid: str) -> list[int]:
    """Every process of the pod with this UID on the real node of the cluster whose state folder is `state`."""
    node = NodeState.load(state)
    if node is None:
        raise RuntimeError(f"no real node in {state}")
    pids: set[int] = set()
    for base in cgroup_dirs(node.cgroup_root):
        for procs in base.glob(f"**/pod{uid}/**/cgroup.procs"):
            pids.update(int(p) for p in procs.read_text().split())
    return sorted(p for p in pids if Path(f"/proc/{p}").exists())


def in_netns(pid: int, *cmd: str, input: str | None = None) -> str:
    """Run `cmd` in the network namespace of process `pid` (and nothing else of it)."""
    done = subprocess.run(["nsenter", "-t", str(pid), "-n", *cmd], input=input, capture_output=True, text=True,
                          timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} in the netns of {pid}: {done.stderr.strip()}")
    return done.stdout


def _rules(pid: int, body: str) -> None:
    """Replace this module's nftables table in the namespace of `pid` with one whose chains hold `body`."""
    heal(pid)
    script = (f"table inet {TABLE} {{\n"
              f"  chain in {{\n    type filter hook input priority -10; policy accept;\n"
              f"    iifname \"lo\" accept\n    {body}\n  }}\n"
              f"  chain out {{\n    type filter hook output priority -10; policy accept;\n"
              f"    oifname \"lo\" accept\n    {body}\n  }}\n"
              f"}}\n")
    in_netns(pid, "nft", "-f", "-", input=script)


def heal(pid: int) -> None:
    """Remove this module's rules from the network namespace of `pid`, if any."""
    subprocess.run(["nsenter", "-t", str(pid), "-n", "nft", "delete", "table", "inet", TABLE],
                   capture_output=True, timeout=30)


def cut(pid: int) -> None:
    """Every packet of the pod but loopback's dropped, in and out."""
    _rules(pid, "drop")


@contextlib.contextmanager
def slow(pid: int, delay_ms: float, loss: float) -> Iterator[None]:
    """While in the block, every packet the pod sends is held back `delay_ms` and `loss` percent are dropped."""
    link = subprocess.Popen(["nsenter", "-t", str(pid), "-n", sys.executable, "-m", "tests.e2e.netem",
                             f"--delay-ms={delay_ms}", f"--loss={loss}"], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).parents[2])
    try:
        if link.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the slow link in the netns of {pid} did not start (exit {link.wait(10)})")
        yield
    finally:
        link.terminate()
        print(f"[chaos] slow link of {pid}: {link.communicate(timeout=30)[0].strip()}")


def freeze(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def kill_containers(pids: list[int]) -> list[int]:
    """SIGKILL each of a pod's processes (`pod_pids`) but the sandbox's `pause`; returns the ones killed."""
    killed = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "pause":
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return killed


def thaw(pid: int) -> None:
    """SIGCONT, if the process is still there (a hung role's process is killed by its recovery)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass

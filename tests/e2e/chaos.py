"""Faults the way clusters break, injected from the host into one pod of the real node (root, as the node runs).

A pod's processes are found by its cgroup (`pod<uid>` under the node's own cgroup root, cgroup v1 with the
cgroupfs driver: `localkube.node`), and its network namespace through any of them (`nsenter -t PID -n`):

- `cut(pid)` / `heal(pid)`: an nftables table in the pod's own network namespace that drops every packet but
  loopback's, in and out: the pod is cut off from the head, the other roles and the API server;
- `lossy(pid, percent)`: drops that share of the packets at random (nftables `numgen`). This kernel has no
  `netem` (CONFIG_NET_SCH_NETEM is unset), so no delay is added;
- `freeze(pid)` / `thaw(pid)`: SIGSTOP and SIGCONT;
- `kill_containers(pids)`: SIGKILL every process of a pod but its sandbox's `pause`: its containers exit.

Every rule lives in the pod's namespace alone and goes with the pod; `heal` removes it before that.
"""

from __future__ import annotations

import os
import signal
import subprocess
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


def lossy(pid: int, percent: int) -> None:
    """`percent` of the pod's packets dropped at random, in and out."""
    _rules(pid, f"numgen random mod 100 < {percent} drop")


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

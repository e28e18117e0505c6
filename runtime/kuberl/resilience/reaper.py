"""Ends a local run's Ray processes when its driver dies without cleaning up (SIGKILL, OOM kill).

Ray's per-node agents (DashboardAgent, RuntimeEnvAgent) outlive a killed driver by about a minute: they
notice their raylet is gone, then wait on the dead GCS to flush logs. `kuberl run` starts this watchdog
beside a local Ray: a small process in its own session that keeps the set of the driver's descendants
(pid and start time, from /proc), and once the driver is gone, SIGKILLs those still running. Linux only;
elsewhere it does nothing.

    python -m kuberl.resilience.reaper DRIVER_PID
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.5


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), which tells a pid apart from a reused one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def parents() -> dict[int, int]:
    """pid -> parent pid of every process visible in /proc."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return out


def descendants(root: int, ppid: dict[int, int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, parent in ppid.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def watch(driver: int) -> None:
    """Track the driver's descendants until it exits, then SIGKILL the ones still running."""
    born = start_time(driver)
    seen: dict[int, str] = {}
    while born is not None and start_time(driver) == born:
        for pid in descendants(driver, parents()) - {os.getpid()}:
            if pid not in seen and (t := start_time(pid)) is not None:
                seen[pid] = t
        time.sleep(POLL_S)
    for pid, t in seen.items():
        if start_time(pid) == t:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def start(driver: int | None = None) -> subprocess.Popen | None:
    """Start the watchdog of `driver` (default: this process), detached in its own session."""
    if not sys.platform.startswith("linux"):
        return None
    return subprocess.Popen([sys.executable, "-m", "kuberl.resilience.reaper", str(driver or os.getpid())],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


if __name__ == "__main__":
    watch(int(sys.argv[1]))

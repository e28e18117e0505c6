"""Processes of the local cluster: start with a log file, record, check, stop.

Each component runs in its own session (Ctrl-C of a terminal does not reach it). Under tests
(``tie_to_parent``) each also dies with the process that started it (PR_SET_PDEATHSIG), so a
killed pytest leaves nothing running and its network namespace goes with it.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Proc:
    name: str
    pid: int
    exe: str
    log: Path
    popen: subprocess.Popen | None = field(default=None, compare=False, repr=False)  # set when we are the parent

    def alive(self) -> bool:
        """Running, and still the process we started (a recycled pid is not ours).

        Our own child is asked directly: between fork and exec its cmdline is still ours, so a
        cmdline check right after the start would call a starting process dead.
        """
        if self.popen is not None:
            return self.popen.poll() is None
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return cmdline == self.exe and state != "Z"

    def tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10) -> None:
        if not self.alive():
            return
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)

    def rss_mib(self) -> float:
        """Resident memory (VmRSS) in MiB, 0 when gone."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0


def start(
    name: str,
    argv: list[str],
    logdir: Path,
    env: dict[str, str] | None = None,
    tie_to_parent: bool = False,
    prefix: tuple[str, ...] = (),
) -> Proc:
    """Start ``argv`` logging to ``logdir/<name>.log``, through ``prefix`` (a command that execs it, such as
    ``netns(pid)``), so that the process, its pid and its recorded executable are ``argv``'s."""
    log = logdir / f"{name}.log"
    wrapped = [*prefix, *argv]
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            wrapped,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            preexec_fn=_die_with_parent if tie_to_parent else None,
        )
    return Proc(name, popen.pid, argv[0], log, popen)


def netns(pid: int) -> tuple[str, ...]:
    """The prefix that runs a command in the network namespace of ``pid`` (nsenter execs it: same pid)."""
    return ("nsenter", f"--net=/proc/{pid}/ns/net", "--")


def save(path: Path, procs: list[Proc]) -> None:
    path.write_text(
        json.dumps([{"name": p.name, "pid": p.pid, "exe": p.exe, "log": str(p.log)} for p in procs], indent=1)
    )


def load(path: Path) -> list[Proc]:
    if not path.exists():
        return []
    return [Proc(d["name"], d["pid"], d["exe"], Path(d["log"])) for d in json.loads(path.read_text())]


def stop_all(procs: list[Proc]) -> None:
    """Newest first, each given time to exit cleanly."""
    for proc in reversed(procs):
        proc.stop()
        if proc.popen is not None:
            try:
                proc.popen.wait(5)
            except subprocess.TimeoutExpired:
                pass

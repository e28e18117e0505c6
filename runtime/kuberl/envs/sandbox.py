"""Model-written Python run in a sandbox: the built-in `python` tool's engine.

Each run is its own process (`sys.executable -I -S`: the standard library only, no environment variables kept but a
few), in a folder of its own that is the only place it may write, with:

- **no network**: a private network namespace (its loopback down), and Landlock refusing TCP bind and connect;
- **no writes outside its folder**: Landlock (Linux >= 5.13), which also keeps it from signalling processes outside
  the sandbox and from abstract Unix sockets, where the kernel can (Landlock ABI >= 6);
- **limits**: CPU seconds, address space, file size and open files (rlimits), a number of processes (RLIMIT_NPROC;
  a root caller runs the code as `nobody`, for whom the limit holds), and wall-clock seconds;
- **nothing left behind**: the code is PID 1's child in a PID namespace of its own, so killing that PID 1 at the
  wall-clock limit ends every process the code forked; its folder is removed after.

Where the kernel allows no part of this (no Landlock, no namespaces for this user: a container's seccomp profile
blocks `unshare`), `available()` says why and `run_python` refuses: the sandbox never runs code half-confined.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
OUTPUT_CHARS = 4000  # of stdout and of stderr, given back
REFUSED = 97  # the bootstrap's exit status when it could not confine the code (its stderr says why)


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use: wall and CPU seconds, address space and largest file (bytes), processes, open files."""

    wall_s: float = 10.0
    cpu_s: int = 5
    memory_bytes: int = 512 * 2**20
    file_bytes: int = 16 * 2**20
    processes: int = 16
    open_files: int = 64


@dataclass(frozen=True)
class SandboxResult:
    """How a run ended. `status`: "ok", "error" (the code raised or exited non-zero), "timeout" (wall clock),
    "cpu" (CPU seconds), "memory" (address space), "refused" (the sandbox could not be set up: `stderr` says why).
    `stdout` and `stderr`: their first OUTPUT_CHARS characters. `seconds`: wall clock of the run."""

    status: str
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def report(self) -> str:
        """One text for the policy's observation: the output, or what stopped the code and its last error line."""
        if self.ok:
            return self.stdout
        last = next((line for line in reversed(self.stderr.strip().splitlines()) if line.strip()), "")
        why = {"timeout": "stopped: it ran past its wall-clock limit", "cpu": "stopped: CPU time limit",
               "memory": "stopped: memory limit", "refused": "the sandbox could not start"}.get(self.status, "error")
        return f"{why}" + (f": {last}" if last else "") + (f"\nstdout: {self.stdout}" if self.stdout else "")


# The bootstrap, run as `python -I -S -c BOOTSTRAP <folder> <limits json> <uid>`: it confines itself, then runs
# <folder>/main.py. Standard library only (-S: no site-packages).
BOOTSTRAP = r'''
import ctypes, json, os, resource, signal, sys
folder, limits, run_as = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
def refuse(what):
    err = ctypes.get_errno()
    sys.stderr.write(f"sandbox: {what}: {os.strerror(err) if err else 'unsupported'}\n")
    os._exit(97)
def procs(uid):
    n = 0
    for p in os.listdir("/proc"):
        try:
            n += p.isdigit() and os.stat(f"/proc/{p}").st_uid == uid
        except OSError:
            pass
    return n
me, running = os.geteuid(), procs(run_as)  # read before a user namespace hides the real user ids
NEWNET, NEWPID, NEWUSER = 0x40000000, 0x20000000, 0x10000000
flags = NEWNET | NEWPID | (0 if me == 0 else NEWUSER)
if libc.unshare(flags) != 0:
    refuse("no private network and PID namespace for this process (unshare)")
def wait_for(pid):
    _, status = os.waitpid(pid, 0)
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
# the first child is the namespace's PID 1: when it ends, every process left in the namespace ends too. It only
# waits for the code, which runs as its child (PID 1 would ignore the kernel's SIGXCPU)
for _ in range(2):
    pid = os.fork()
    if pid:
        wait_for(pid)
if run_as != me:
    os.setgroups([]); os.setgid(run_as); os.setuid(run_as)
abi = libc.syscall(444, None, 0, 1)
if abi < 1:
    refuse("no Landlock in this kernel (Linux >= 5.13 with landlock in its lsm= list)")
# write, remove and make rights; refer (ABI 2) and truncate (ABI 3); TCP bind and connect (4); signals, sockets (6)
write = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12)) | (1 << 13 if abi >= 2 else 0)
write |= 1 << 14 if abi >= 3 else 0
net = 0b11 if abi >= 4 else 0
scoped = 0b11 if abi >= 6 else 0
attr = (ctypes.c_uint64 * 3)(write, net, scoped)
size = 24 if abi >= 6 else 16 if abi >= 4 else 8
ruleset = libc.syscall(444, ctypes.byref(attr), size, 0)
if ruleset < 0:
    refuse("Landlock refused the ruleset")
class Beneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]
for path, allowed in ((folder, write), ("/dev/null", (1 << 1) | (1 << 14 if abi >= 3 else 0))):
    fd = os.open(path, os.O_PATH)
    if libc.syscall(445, ruleset, 1, ctypes.byref(Beneath(allowed, fd)), 0) != 0:
        refuse(f"Landlock refused the rule for {path}")
    os.close(fd)
if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.syscall(446, ruleset, 0) != 0:
    refuse("Landlock could not restrict this process")
for rlim, value in ((resource.RLIMIT_AS, limits["memory_bytes"]), (resource.RLIMIT_FSIZE, limits["file_bytes"]),
                    (resource.RLIMIT_NOFILE, limits["open_files"]), (resource.RLIMIT_CORE, 0),
                    (resource.RLIMIT_NPROC, running + limits["processes"])):
    resource.setrlimit(rlim, (value, value))
resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))  # SIGXCPU first, SIGKILL a second on
os.chdir(folder)
sys.argv = ["main.py"]
code = compile(open("main.py").read(), "main.py", "exec")
del libc, ctypes, Beneath, attr
exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
'''


def available() -> str | None:
    """None where this process can run the sandbox; else the reason it cannot (one line). Runs a trivial program."""
    result = run_python("pass", SandboxLimits(wall_s=30.0))
    return None if result.ok else result.report()


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run `code` (a Python program) in the sandbox and say how it ended. Never raises for what the code does."""
    root = Path(tempfile.mkdtemp(prefix="kuberl-sandbox-"))  # 0700: its output files stay the caller's
    folder = root / "work"
    folder.mkdir()
    run_as = NOBODY if os.geteuid() == 0 else os.geteuid()
    python = interpreter(run_as)
    (folder / "main.py").write_text(code)
    if run_as != os.geteuid():
        os.chmod(root, 0o711)  # `nobody` passes through to its folder, and reads nothing else here
        os.chown(folder, run_as, run_as)
        os.chown(folder / "main.py", run_as, run_as)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "TMPDIR": str(folder), "LANG": "C.UTF-8"}
    t0 = time.monotonic()
    try:
        with open(root / "stdout", "w+b") as out, open(root / "stderr", "w+b") as err:
            proc = subprocess.Popen([python, "-I", "-S", "-c", BOOTSTRAP, str(folder),
                                     json.dumps(asdict(limits)), str(run_as)],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=folder, env=env,
                                    start_new_session=True)
            timed_out = _wait(proc, limits.wall_s)
            stdout, stderr = _head(out), _head(err)
        return SandboxResult(_status(proc.returncode, timed_out, stderr), proc.returncode, stdout, stderr,
                             time.monotonic() - t0)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def interpreter(run_as: int) -> str:
    """The Python that runs the code: this one, unless `run_as` is another user (`nobody`, for a root caller) who
    cannot read this one's standard library (a Python under /root), then the system's /usr/bin/python3."""
    if run_as == os.geteuid() or _others_can_read(Path(sysconfig.get_paths()["stdlib"]) / "os.py"):
        return sys.executable
    return SYSTEM_PYTHON


def _others_can_read(path: Path) -> bool:
    """Whether any user may read `path`: every folder above it searchable by others, and it readable."""
    try:
        path = path.resolve()
        return (all(p.stat().st_mode & stat.S_IXOTH for p in path.parents)
                and bool(path.stat().st_mode & stat.S_IROTH))
    except OSError:
        return False


def _wait(proc: subprocess.Popen, wall_s: float) -> bool:
    """Wait for the bootstrap; past `wall_s`, kill its process group (the namespace's PID 1 with it, and so every
    process in the namespace). Returns once the group is gone; True when it was killed."""
    try:
        proc.wait(timeout=wall_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        timed_out = True
    _until_gone(proc.pid)
    return timed_out


def _until_gone(group: int, within_s: float = 5.0) -> None:
    """Wait until no process of the process group `group` is left (the namespace's processes, killed with its PID 1,
    take a moment to go)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)


def _head(f) -> str:
    f.seek(0)
    return f.read(OUTPUT_CHARS).decode("utf-8", errors="replace")


def _status(returncode: int, timed_out: bool, stderr: str) -> str:
    if timed_out:
        return "timeout"
    if returncode == REFUSED and stderr.startswith("sandbox: "):
        return "refused"
    if returncode in (128 + signal.SIGXCPU, -signal.SIGXCPU):
        return "cpu"
    if "MemoryError" in stderr:
        return "memory"
    return "ok" if returncode == 0 else "error"

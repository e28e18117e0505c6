"""The operator as a real process on this machine: `kuberl operator`, with a kubeconfig of its own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from .waits import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 2) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as rsp:
            return rsp.status, rsp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError:
        return 0, ""


def kuberl_command() -> list[str]:
    """`kuberl` beside this interpreter (the venv's console script), else the same entry point by module."""
    script = Path(sys.executable).with_name("kuberl")
    return (
        [str(script)]
        if script.is_file()
        else [sys.executable, "-c", "import sys; from kuberl.cli import main; sys.exit(main())"]
    )


class OperatorProcess:
    """One operator process at a time, its log in a file, on fixed liveness and metrics ports.

    ``namespaces`` empty: every namespace (``-A``), as the chart's default ClusterRole grants."""

    def __init__(
        self,
        kubeconfig: Path,
        log_dir: Path,
        namespaces: tuple[str, ...] = (),
        image: str = "kuberl-runtime:test",
        resync_seconds: float = 2,
        via: str = "cli",
        secret_probe_seconds: float | None = None,
        verbose: bool = True,
        extra: tuple[str, ...] = (),
    ):
        self.kubeconfig, self.log_dir, self.namespaces, self.image = kubeconfig, log_dir, namespaces, image
        self.resync_seconds, self.via = resync_seconds, via
        self.secret_probe_seconds = secret_probe_seconds  # None: at every resync (a Secret deleted is seen at once)
        self.verbose = verbose  # kopf's debug log (the tests read it); the chart's default is off
        self.extra = extra  # more `kuberl operator` arguments (--leader-elect ...)
        self.liveness_port, self.metrics_port = free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = log_dir / "operator-0.log"
        self.starts = 0

    @property
    def liveness_url(self) -> str:
        return f"http://127.0.0.1:{self.liveness_port}/healthz"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        scope = [a for ns in self.namespaces for a in ("-n", ns)] or ["-A"]
        if self.via == "kopf":  # plain `kopf run`, configured through the environment
            return [
                sys.executable,
                "-m",
                "kopf",
                "run",
                "--standalone",
                *(["--verbose"] if self.verbose else []),
                *scope,
                "-m",
                "kuberl_operator.handlers",
                "--liveness",
                self.liveness_url,
            ]
        return [
            *kuberl_command(),
            "operator",
            *(["--verbose"] if self.verbose else []),
            *scope,
            "--metrics-port",
            str(self.metrics_port),
            "--metrics-address",
            "127.0.0.1",
            "--liveness",
            self.liveness_url,
            "--image",
            self.image,
            "--max-gpus-per-node",
            "8",
            *self.extra,
        ]

    def start(self, timeout: float = 60) -> None:
        self.starts += 1
        self.log_path = self.log_dir / f"operator-{self.starts}.log"
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "KUBERL_METRICS_PORT": str(self.metrics_port),
            "KUBERL_METRICS_ADDRESS": "127.0.0.1",
            "KUBERL_RUNTIME_IMAGE": self.image,
            "KUBERL_RESYNC_SECONDS": str(self.resync_seconds),
            "KUBERL_SECRET_PROBE_SECONDS": str(self.secret_probe_seconds or self.resync_seconds),
        }  # re-applied all the time: nothing may duplicate
        env.pop("KUBERNETES_SERVICE_HOST", None)  # not in a pod: the kubeconfig is the only way in
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_for(
            lambda: self.alive() and http_get(self.liveness_url)[0] == 200 and http_get(self.metrics_url)[0] == 200,
            timeout,
            "the operator to serve its liveness and metrics endpoints",
            self.tail,
        )

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"the operator process exited ({self.proc and self.proc.returncode}){self.tail()}")
        return True

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def rss_mib(self) -> float:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except (OSError, AttributeError):
            pass
        return 0.0

    def tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"\n--- operator log ({self.log_path}), last {lines} lines ---\n" + "\n".join(text.splitlines()[-lines:])

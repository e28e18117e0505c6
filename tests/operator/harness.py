"""The operator as a real process (`kopf run`, or `python -m kuberl_operator operator`) and bounded waits."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


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


class OperatorProcess:
    """One operator process at a time, its log in a file, on fixed liveness and metrics ports."""

    def __init__(self, kubeconfig: Path, namespace: str, log_dir: Path, image: str = "kuberl-runtime:test"):
        self.kubeconfig, self.namespace, self.log_dir, self.image = kubeconfig, namespace, log_dir, image
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

    def command(self, via: str) -> list[str]:
        if via == "kopf":  # plain `kopf run`, configured through the environment
            return [sys.executable, "-m", "kopf", "run", "--standalone", "--verbose", "-n", self.namespace,
                    "-m", "kuberl_operator.handlers", "--liveness", self.liveness_url]
        return [sys.executable, "-m", "kuberl_operator", "operator", "--verbose", "-n", self.namespace,
                "--metrics-port", str(self.metrics_port), "--metrics-address", "127.0.0.1",
                "--liveness", self.liveness_url, "--image", self.image, "--max-gpus-per-node", "8"]

    def start(self, via: str = "kopf", timeout: float = 30) -> None:
        self.starts += 1
        self.log_path = self.log_dir / f"operator-{self.starts}.log"
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "KUBERL_METRICS_PORT": str(self.metrics_port),
               "KUBERL_METRICS_ADDRESS": "127.0.0.1", "KUBERL_RUNTIME_IMAGE": self.image,
               "KUBERL_RESYNC_SECONDS": "2"}  # every job is re-applied all the time: nothing may duplicate
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(via), env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: self.alive() and http_get(self.liveness_url)[0] == 200 and http_get(self.metrics_url)[0] == 200,
                 timeout, "the operator to serve its liveness and metrics endpoints", self.tail)

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"the operator process exited ({self.proc and self.proc.returncode}){self.tail()}")
        return True

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"\n--- operator log ({self.log_path}), last {lines} lines ---\n" + "\n".join(text.splitlines()[-lines:])


def wait_for(fn: Callable[[], T], timeout: float = 10, what: str = "a condition",
             logs: Callable[[], str] | None = None, interval: float = 0.05) -> T:
    """Poll ``fn`` until it returns something truthy; fail after ``timeout`` seconds, with context."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {value!r}"
                                 + (logs() if logs else ""))
        time.sleep(interval)


def holds(fn: Callable[[], Any], seconds: float, what: str, interval: float = 0.1) -> None:
    """Assert that ``fn`` stays truthy for a while (for things that must not change)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert fn(), f"{what} stopped holding"
        time.sleep(interval)

"""`kuberl run` refuses what cannot work before any worker starts: one error line naming the field or
flag, exit 1, no traceback, no Ray, nothing created (not even the --out folder)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from .conftest import REPO


def busy_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


CASES = [
    ("checkpoint-path", ["--set", "trainer.checkpoint.path=/proc/kuberl-nope"], "spec.trainer.checkpoint.path:"),
    ("metrics-address", ["--metrics-port", "0", "--metrics-address", "not-an-ip"],
     "spec.trainer.metrics.prometheusAddress (--metrics-address):"),
    ("metrics-port", ["--metrics-port", "BUSY"], "spec.trainer.metrics.prometheusPort (--metrics-port):"),
    ("out", ["--out", "FILE/sub"], "--out: cannot write"),
    ("gpu", ["--set", "roles.critic.gpus=1"], "spec.roles.critic.gpus: 1 GPU(s) per replica, but this host has none"),
]


@pytest.mark.parametrize("name, flags, first", CASES, ids=[c[0] for c in CASES])
def test_refused_before_workers_start(netns, tmp_path, name, flags, first):
    held = busy_port()
    (tmp_path / "file").write_text("")
    flags = [f.replace("BUSY", str(held.getsockname()[1])).replace("FILE", str(tmp_path / "file")) for f in flags]
    out = ["--out", str(tmp_path / "new" / "run")] if "--out" not in flags else []
    env_gpu = {"CUDA_VISIBLE_DEVICES": ""}  # a host with no GPU, whatever this one has
    proc = subprocess.run([sys.executable, "-m", "kuberl.cli", "run", "examples/quickstart.yaml", "--steps", "1",
                           "--no-progress", *out, *flags], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env_gpu})
    held.close()
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {first}") and "(fix: " in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and "step 1/1" not in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing half-created: no --out, no parent of it

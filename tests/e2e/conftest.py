"""A kind cluster with KubeRay and our CRD, the operator as a local process, and a kubectl client.

Skipped, with the reason, where Docker (with a running engine), kind, kubectl or helm is missing,
or where the runtime image is not built. Point ``KUBERL_E2E_KUBECONFIG`` at an existing cluster
(KubeRay installed, the runtime image pullable) to skip the kind set-up. The cluster is on the host
network, so run outside the tests' loopback-only namespace: ``KUBERL_NO_NETNS=1``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.operator_process import OperatorProcess
from tests.conftest import REPO, in_loopback_only_netns

CLUSTER = "kuberl-e2e"
NAMESPACE = "kuberl-e2e"
IMAGE = os.environ.get("KUBERL_E2E_IMAGE", "ghcr.io/kuberl/kuberl-runtime:0.1.0")
KUBERAY_CHART_VERSION = os.environ.get("KUBERL_E2E_KUBERAY_VERSION", "1.5.1")


def run(*cmd: str, env: dict[str, str] | None = None, input: str | None = None, timeout: float = 600) -> str:
    proc = subprocess.run(cmd, env=env, input=input, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def why_not() -> str | None:
    """Why a kind cluster cannot be made here, or None."""
    for tool in ("docker", "kind", "kubectl", "helm"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "no Docker engine is running (`docker info` fails)"
    if in_loopback_only_netns():
        return "the tests run in a loopback-only network namespace; kind is on the host network (KUBERL_NO_NETNS=1)"
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        return f"the runtime image {IMAGE} is not built (`make images`, or set KUBERL_E2E_IMAGE)"
    return None


@pytest.fixture(scope="session")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    existing = os.environ.get("KUBERL_E2E_KUBECONFIG")
    if existing:
        if in_loopback_only_netns():
            pytest.skip("the tests run in a loopback-only network namespace: set KUBERL_NO_NETNS=1")
        yield Path(existing)
        return
    reason = why_not()
    if reason:
        pytest.skip(f"e2e on kind: {reason}")
    path = tmp_path_factory.mktemp("kind") / "kubeconfig"
    env = {**os.environ, "KUBECONFIG": str(path)}
    run("kind", "create", "cluster", "--name", CLUSTER, "--kubeconfig", str(path), "--wait", "180s")
    try:
        run("kind", "load", "docker-image", IMAGE, "--name", CLUSTER)
        run("helm", "repo", "add", "kuberay", "https://ray-project.github.io/kuberay-helm/", "--force-update", env=env)
        run("helm", "install", "kuberay-operator", "kuberay/kuberay-operator", "--version", KUBERAY_CHART_VERSION,
            "--namespace", "kuberay-system", "--create-namespace", "--wait", "--timeout", "5m", env=env)
        yield path
    finally:
        if os.environ.get("KUBERL_E2E_KEEP") != "1":
            run("kind", "delete", "cluster", "--name", CLUSTER)


class Kubectl:
    """kubectl with JSON in and out, in one namespace."""

    def __init__(self, kubeconfig: Path, namespace: str):
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        self.namespace = namespace

    def __call__(self, *args: str, input: str | None = None) -> str:
        return run("kubectl", "-n", self.namespace, *args, env=self.env, input=input)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        out = self("get", kind, name, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None

    def list(self, kind: str, selector: str = "") -> list[dict[str, Any]]:
        return json.loads(self("get", kind, "-o", "json", *(["-l", selector] if selector else [])))["items"]

    def apply(self, obj: dict[str, Any]) -> None:
        self("apply", "-f", "-", input=json.dumps(obj))

    def patch(self, kind: str, name: str, patch: dict[str, Any]) -> None:
        self("patch", kind, name, "--type", "merge", "-p", json.dumps(patch))

    def delete(self, kind: str, name: str, wait: bool = False) -> None:
        self("delete", kind, name, "--ignore-not-found", f"--wait={str(wait).lower()}")


@pytest.fixture(scope="session")
def kubectl(kubeconfig: Path) -> Kubectl:
    k = Kubectl(kubeconfig, NAMESPACE)
    run("kubectl", "apply", "-f", str(REPO / "crds"), env=k.env)
    if subprocess.run(["kubectl", "get", "namespace", NAMESPACE], env=k.env, capture_output=True).returncode != 0:
        run("kubectl", "create", "namespace", NAMESPACE, env=k.env)
    return k


@pytest.fixture(scope="session")
def operator(kubectl: Kubectl, kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(kubeconfig, tmp_path_factory.mktemp("operator"), namespaces=(NAMESPACE,), image=IMAGE)
    proc.start(timeout=60)
    yield proc
    proc.stop()

"""Real pods: the local control plane with a real node (kubelet, containerd, runc), the chart installed with
the operator running as a pod from the local image, and a kubectl client.

The cluster is cluster/localkube's, started inside the tests' loopback-only network namespace with
``real_node=True``: pods run in the node's own namespace (node.py), their images are the OCI tars
`make images` built (images.py), loaded into the node's containerd at start. It lives as long as this
package's tests (its veth would make the rest of the session's namespace more than loopback). Two kwok GPU nodes sit
beside it for GPU-shaped jobs. Without Go (and no cached build) every test here skips, naming
`make cluster`; with Go, a missing build or missing images fail, naming the command that makes them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chart.render import CHART, Helm
from tests.cluster.waits import wait_for
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "cluster"))

from localkube import images, node, pins  # noqa: E402
from localkube.nodes import gpu_node  # noqa: E402
from localkube.stack import Cluster  # noqa: E402

RELEASE, OPERATOR_NAMESPACE = "kuberl", "kuberl-system"
LOCAL_VALUES = REPO / "cluster" / "values-local.yaml"
IMAGES = images.DEFAULT  # pause, operator, runtime-cpu


def run(*cmd: str, env: dict[str, str] | None = None, input: str | None = None, timeout: float = 120) -> str:
    proc = subprocess.run(cmd, env=env, input=input, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def image_tars(keys: tuple[str, ...] = IMAGES) -> list[Path]:
    tars = [images.tar_path(key) for key in keys]
    missing = [key for key, tar in zip(keys, tars) if not tar.is_file()]
    if missing:
        pytest.fail(f"images not built: {', '.join(missing)}: run `make images` (`make test` does it first)")
    return tars


@pytest.fixture(scope="package")
def real_cluster(netns: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cached = pins.find_cached()
    if cached is None:
        if pins.go() is None:
            pytest.skip("no Go toolchain and no cached build: the real-pod tests need `make cluster`")
        pytest.fail("Go is here but the cluster is not built: run `make cluster-build` (`make test` does it first)")
    if missing := node.missing_tools():
        pytest.skip(f"the real node needs {', '.join(missing)}: `make node-deps` installs them")
    if os.geteuid() != 0:
        pytest.skip("the real node needs root (containerd, runc, network namespaces, cgroups)")
    state = tmp_path_factory.mktemp("real-cluster")
    cluster = Cluster(state, cached, tie_to_parent=True, log=lambda line: None, real_node=True, images=image_tars())
    cluster.start(nodes=(gpu_node("gpu-0"), gpu_node("gpu-1")))
    yield cluster
    cluster.stop()


class Kubectl:
    """The cluster's kubectl, JSON in and out, in one namespace."""

    def __init__(self, cluster: Cluster, namespace: str):
        self.base = [cluster.bin("kubectl"), f"--kubeconfig={cluster.kubeconfig}"]
        self.namespace = namespace

    def __call__(self, *args: str, input: str | None = None, timeout: float = 120) -> str:
        return run(*self.base, "-n", self.namespace, *args, input=input, timeout=timeout)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        out = self("get", kind, name, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None

    def list(self, kind: str, selector: str = "") -> list[dict[str, Any]]:
        return json.loads(self("get", kind, "-o", "json", *(["-l", selector] if selector else [])))["items"]

    def apply(self, obj: dict[str, Any] | str) -> None:
        self("apply", "--server-side", "-f", "-", input=obj if isinstance(obj, str) else json.dumps(obj))

    def delete(self, kind: str, name: str, wait: bool = False) -> None:
        self("delete", kind, name, "--ignore-not-found", f"--wait={str(wait).lower()}")

    def exec(self, pod: str, *cmd: str, container: str | None = None) -> subprocess.CompletedProcess:
        args = [*self.base, "-n", self.namespace, "exec", pod, *(["-c", container] if container else []), "--", *cmd]
        return subprocess.run(args, capture_output=True, text=True, timeout=60)

    def in_namespace(self, namespace: str) -> Kubectl:
        other = object.__new__(Kubectl)
        other.__dict__.update(self.__dict__, namespace=namespace)
        return other


@pytest.fixture(scope="package")
def kubectl(real_cluster: Cluster) -> Kubectl:
    return Kubectl(real_cluster, "default")




@pytest.fixture(scope="package")
def installed(real_cluster: Cluster, helm: Helm, kubectl: Kubectl) -> Kubectl:
    """`make install`'s command: the chart with the local values, the operator a pod of the local image."""
    helm.run("upgrade", "--install", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE, "--create-namespace",
             "--kubeconfig", str(real_cluster.kubeconfig), "-f", str(LOCAL_VALUES), "--wait", "--timeout", "4m")
    k = kubectl.in_namespace(OPERATOR_NAMESPACE)
    wait_for(lambda: operator_ready(k), 240, "operator pod Ready", lambda: k("get", "pods", "-o", "wide"), interval=2)
    return k


def operator_ready(k: Kubectl) -> bool:
    pods = k.list("pods", f"app.kubernetes.io/instance={RELEASE}")
    return bool(pods) and all(
        any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])) for p in pods
    )

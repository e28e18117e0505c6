"""The real stack for a whole session: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
kwok and the KubeRay operator (cluster/localkube) on 127.0.0.1 inside the tests' loopback-only
namespace; the Helm chart installed into it; the operator run here as `kuberl operator` with the
chart's ServiceAccount token. Each test gets its own namespace.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "cluster"))

from localkube import pins, pki  # noqa: E402
from localkube.api import NAMESPACES, RLTJ, Api  # noqa: E402
from localkube.nodes import NodeSpec, gpu_node  # noqa: E402
from localkube.stack import Cluster  # noqa: E402

from tests.chart.render import Helm  # noqa: E402

from .operator_process import OperatorProcess  # noqa: E402

RELEASE, OPERATOR_NAMESPACE = "kuberl", "kuberl-system"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{RELEASE}"  # the chart's ServiceAccount
NODES = (NodeSpec("cpu-0"), NodeSpec("cpu-1"), *(gpu_node(f"gpu-{i}") for i in range(4)))
JOBS_GONE_S = 30.0  # a test's jobs deleted (the operator's finalizer released) before its namespace is


@pytest.fixture(scope="session")
def cluster_cache() -> Path:
    """The built binaries; skip (one line naming `make cluster`) only where there is no Go toolchain."""
    cached = pins.find_cached()
    if cached is not None:
        return cached
    if pins.go() is None:
        pytest.skip("no Go toolchain and no cached control-plane build: the real-cluster tests need `make cluster`")
    pytest.fail("Go is here but the control plane is not built: run `make cluster-build` (`make test` does it first)")


@pytest.fixture(scope="session")
def cluster(netns: None, cluster_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state = tmp_path_factory.mktemp("cluster")
    c = Cluster(state, cluster_cache, tie_to_parent=True, log=lambda line: None).start(nodes=NODES)
    yield c
    c.stop()


@pytest.fixture(scope="session")
def admin(cluster: Cluster) -> Api:
    return cluster.admin()


@pytest.fixture(scope="session")
def kubectl(cluster: Cluster) -> Callable[..., subprocess.CompletedProcess]:
    """The cluster's own kubectl (same release as the API server), as the admin."""

    def run(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [cluster.bin("kubectl"), f"--kubeconfig={cluster.kubeconfig}", *args],
            capture_output=True,
            text=True,
            input=stdin,
            timeout=60,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    return run




@pytest.fixture(scope="session")
def release(cluster: Cluster, helm: Helm) -> str:
    """`helm install` of charts/kuberl (every namespace watched: the ClusterRole)."""
    helm.install(cluster.kubeconfig)
    return RELEASE


@pytest.fixture(scope="session")
def operator_kubeconfig(cluster: Cluster, admin: Api, release: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig holding only the chart's ServiceAccount token: the chart's RBAC is all it has."""
    path = tmp_path_factory.mktemp("operator-auth") / "kubeconfig"
    path.write_text(pki.kubeconfig(cluster.server, cluster.pki, token=admin.token(OPERATOR_NAMESPACE, release)))
    return path


@pytest.fixture(scope="session")
def operator(operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(operator_kubeconfig, tmp_path_factory.mktemp("operator"))
    proc.start()
    yield proc
    proc.stop()


def slug(request: pytest.FixtureRequest, limit: int) -> str:
    return re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_"))[:limit].strip("-")


@pytest.fixture
def ns(admin: Api, request: pytest.FixtureRequest) -> Iterator[Api]:
    """A namespace of this test's own (the admin's client in it); deleted afterwards. Its jobs go first, and are
    waited for (the operator's delete handler releases each one's finalizer), so that no job is left for the
    session's operator to work on during the next tests (issue 29: 24 were, once, in namespaces terminating)."""
    name = f"t-{slug(request, 40)}-{secrets.token_hex(2)}"
    admin.create(NAMESPACES, {"metadata": {"name": name}}, namespace=None)
    yield admin.in_namespace(name)
    delete_namespace(admin, name)


def delete_namespace(admin: Api, name: str) -> None:
    """Delete the namespace's jobs and wait up to JOBS_GONE_S for them to go (a job still there after that is
    left to the namespace's deletion); then the namespace."""
    api = admin.in_namespace(name)
    for job in api.list(RLTJ):
        api.delete(RLTJ, job["metadata"]["name"])
    deadline = time.monotonic() + JOBS_GONE_S
    while api.list(RLTJ) and time.monotonic() < deadline:
        time.sleep(0.2)
    admin.delete(NAMESPACES, name, namespace=None)


@pytest.fixture
def job_name(request: pytest.FixtureRequest) -> str:
    return f"{slug(request, 30)}-{secrets.token_hex(2)}"

"""Fixtures: one validating API server on 127.0.0.1 and one operator process for the whole session."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .apiserver import ServerThread
from .client import NAMESPACES, Client
from .harness import OperatorProcess
from .schemas import make_validator

NAMESPACE = "kuberl-test"


@pytest.fixture(scope="session")
def kuberay_dir(shared_dir: Path) -> Path:
    path = shared_dir / "kuberay"
    if not (path / "ray.io_rayclusters.yaml").is_file():
        pytest.skip(f"{path}/ray.io_rayclusters.yaml is absent: RayClusters cannot be validated")
    return path


@pytest.fixture(scope="session")
def validator(kuberay_dir: Path):
    return make_validator(kuberay_dir)


@pytest.fixture(scope="session")
def apiserver(netns: None, validator) -> Iterator[ServerThread]:
    server = ServerThread(validator).start()
    Client(server.url, NAMESPACE).create(NAMESPACES, {"metadata": {"name": NAMESPACE}}, namespace=None)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def api(apiserver: ServerThread) -> Client:
    return Client(apiserver.url, NAMESPACE)


@pytest.fixture(scope="session")
def kubeconfig(apiserver: ServerThread, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kube") / "config"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": apiserver.url}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": NAMESPACE}}],
    }))
    return path


@pytest.fixture(scope="session")
def operator(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(kubeconfig, NAMESPACE, tmp_path_factory.mktemp("operator"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def job_name(request: pytest.FixtureRequest) -> str:
    """Unique per test, so that scenarios share one server and one operator without interfering."""
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_"))[:30].strip("-")
    return f"{stem}-{secrets.token_hex(2)}"


@pytest.fixture
def no_rejections(apiserver: ServerThread) -> Iterator[None]:
    """Fail the test if any write during it did not validate against its schema."""
    before = apiserver.call(lambda s: len(s.rejections))
    yield
    rejected = apiserver.call(lambda s: s.rejections[before:])
    assert not rejected, "writes rejected by schema validation:\n" + "\n".join(map(str, rejected))

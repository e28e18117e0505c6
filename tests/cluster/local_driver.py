"""A real `kuberl run` on this machine in place of a job's driver pod (kwok runs no container): the environment
and the ServiceAccount token that pod would have, so it reports progress into the job's ConfigMap."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from localkube.api import Api
from localkube.stack import Cluster

from .operator_process import kuberl_command
from .waits import wait_for


def driver_env(cluster: Cluster, admin: Api, namespace: str, job: str, sa_dir: Path, ctx=None) -> dict[str, str]:
    """Env of `kuberl run` as the driver of ``job``: once the operator made its RoleBinding, a TokenRequest token
    of ``<job>-driver`` and the cluster's CA written where the kubelet would mount them (``sa_dir``)."""
    wait_for(
        lambda: admin.in_namespace(namespace).get("rbac.authorization.k8s.io/v1/rolebindings", f"{job}-driver"),
        60,
        "the driver's RoleBinding",
        ctx,
    )
    sa_dir.mkdir(parents=True, exist_ok=True)
    (sa_dir / "token").write_text(admin.token(namespace, f"{job}-driver", 3600))
    (sa_dir / "ca.crt").write_bytes((cluster.pki / "ca.crt").read_bytes())
    return {
        **os.environ,
        "KUBERL_PROGRESS_CONFIGMAP": f"{job}-progress",
        "KUBERL_NAMESPACE": namespace,
        "KUBERL_API_URL": cluster.server,
        "KUBERL_SA_DIR": str(sa_dir),
    }


def start_driver(env: dict[str, str], manifest: Path, out: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """`kuberl run MANIFEST --out OUT --no-progress ARGS...`, its output in ``log``."""
    return subprocess.Popen(
        [*kuberl_command(), "run", str(manifest), "--out", str(out), "--no-progress", *args],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )

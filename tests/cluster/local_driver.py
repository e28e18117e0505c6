"""A real `kuberl run` on this machine in place of a job's driver pod (kwok runs no container), with the pod's
reporter sidecar beside it: the environment and the ServiceAccount token (the reporter's alone) that pod would
have, so the driver's progress reaches the job's ConfigMap as in the pod."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from localkube.api import Api
from localkube.stack import Cluster

from .operator_process import kuberl_command
from .waits import wait_for

REPORTER_ENV = ("KUBERL_PROGRESS_CONFIGMAP", "KUBERL_NAMESPACE", "KUBERL_API_URL", "KUBERL_SA_DIR")  # its only


def driver_env(cluster: Cluster, admin: Api, namespace: str, job: str, sa_dir: Path, ctx=None) -> dict[str, str]:
    """Env of the driver pod of ``job``: once the operator made its RoleBinding, a TokenRequest token of
    ``<job>-driver`` and the cluster's CA written where the kubelet would mount them (``sa_dir``), for its reporter
    sidecar, and the folder the driver and the reporter share beside it."""
    wait_for(
        lambda: admin.in_namespace(namespace).get("rbac.authorization.k8s.io/v1/rolebindings", f"{job}-driver"),
        60,
        "the driver's RoleBinding",
        ctx,
    )
    sa_dir.mkdir(parents=True, exist_ok=True)
    (sa_dir / "token").write_text(admin.token(namespace, f"{job}-driver", 3600))
    (sa_dir / "ca.crt").write_bytes((cluster.pki / "ca.crt").read_bytes())
    progress = sa_dir.parent / "progress"
    progress.mkdir(exist_ok=True)
    return {
        **os.environ,
        "KUBERL_PROGRESS_DIR": str(progress),
        "KUBERL_PROGRESS_CONFIGMAP": f"{job}-progress",
        "KUBERL_NAMESPACE": namespace,
        "KUBERL_API_URL": cluster.server,
        "KUBERL_SA_DIR": str(sa_dir),
    }


class DriverPod:
    """`kuberl run` and its reporter sidecar (`kuberl report-progress`), as the pod runs them: the driver without
    the token; once it ends, the reporter is stopped (SIGTERM) and sends the driver's last report."""

    def __init__(self, env: dict[str, str], manifest: Path, out: Path, log: Path, *args: str):
        driver_env = {k: v for k, v in env.items() if k not in REPORTER_ENV}
        self.reporter = subprocess.Popen([*kuberl_command(), "report-progress", "--dir", env["KUBERL_PROGRESS_DIR"]],
                                         env=env, stdout=log.with_suffix(".reporter.log").open("wb"),
                                         stderr=subprocess.STDOUT)
        self.driver = subprocess.Popen(
            [*kuberl_command(), "run", str(manifest), "--out", str(out), "--no-progress", *args],
            env=driver_env, stdout=log.open("wb"), stderr=subprocess.STDOUT)

    def poll(self) -> int | None:
        return self.driver.poll()

    def wait(self, timeout: float) -> int:
        """The driver's exit code, once the reporter has relayed its last report and exited."""
        code = self.driver.wait(timeout)
        self.reporter.terminate()
        self.reporter.wait(60)
        return code

    def kill(self) -> None:
        for proc in (self.driver, self.reporter):
            proc.kill()
            proc.wait(10)


def start_driver(env: dict[str, str], manifest: Path, out: Path, log: Path, *args: str) -> DriverPod:
    """The driver pod's two processes: `kuberl run MANIFEST --out OUT --no-progress ARGS...` (output in ``log``)
    and its reporter (output beside it, ``.reporter.log``)."""
    return DriverPod(env, manifest, out, log, *args)

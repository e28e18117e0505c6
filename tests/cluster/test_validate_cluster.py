"""`kuberl validate JOB --cluster` against the real stack: each problem a line that names the field or object and
the fix, all of them at once, nothing created; with no rights, what could not be read is said, not guessed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from localkube import pki
from localkube.api import RLTJ, SERVICEACCOUNTS, Api
from localkube.stack import Cluster

from .conftest import OPERATOR_NAMESPACE, RELEASE
from .jobs import manifest
from .operator_process import OperatorProcess, kuberl_command
from .test_operator_ha import ELECTION, LEASES, leading
from .waits import wait_for

pytestmark = pytest.mark.netns
PVCS = "v1/persistentvolumeclaims"


def validate(job: dict, tmp_path: Path, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / f"{job['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(job))
    return subprocess.run([*kuberl_command(), "validate", str(path), "--spec-only", "--cluster",
                           "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True, timeout=120)


def errors(proc: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return [line.removeprefix("error: cluster: ") for line in proc.stderr.splitlines() if line.startswith("error:")]


def test_a_job_this_cluster_cannot_run_gets_every_reason(
    ns: Api, admin: Api, cluster: Cluster, release: str, tmp_path: Path
) -> None:
    roles = {"actor": {"replicas": 1, "gpus": 16}, "critic": {"nodeSelector": {"pool": "nope"}}}
    job = manifest("cannot-run", roles=roles, trainer={"checkpoint": {"volumeClaim": "ckpt"}})
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    admin.delete(LEASES, RELEASE, namespace=OPERATOR_NAMESPACE)  # test_operator_ha's; the session's has none
    proc = validate(job, tmp_path, cluster.kubeconfig, "-n", ns.namespace)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    found = errors(proc)
    expect = {
        "spec.roles.actor: no node can hold one pod": "nvidia.com/gpu 8 allocatable",
        "spec.roles.critic: no node can hold one pod": "lacks label pool=nope",
        "metadata.labels.kueue.x-k8s.io/queue-name: Kueue is not installed": "remove the label",
        "spec.trainer.checkpoint.volumeClaim: PersistentVolumeClaim ckpt does not exist": "ReadWriteMany",
        "no kuberl operator is running": "--leader-elect",  # the session's operator runs without the election
    }
    for start, fix in expect.items():
        assert [line for line in found if line.startswith(start) and fix in line], f"{start!r}:\n" + "\n".join(found)
    assert len(found) == len(expect), "\n".join(found)
    assert not ns.list(RLTJ), "a dry run creates nothing"

    found = errors(validate(manifest("dra", placement={"mode": "dra"}), tmp_path, cluster.kubeconfig, "-n",
                            ns.namespace))
    assert [line for line in found if line.startswith("spec.placement.deviceClass: DeviceClass gpu.nvidia.com does "
                                                      "not exist") and "kubectl get deviceclasses" in line], found

    ns.create(PVCS, {"metadata": {"name": "ckpt"}, "spec": {"accessModes": ["ReadWriteOnce"],
                                                             "resources": {"requests": {"storage": "1Gi"}}}})
    found = errors(validate(manifest("rwo", trainer={"checkpoint": {"volumeClaim": "ckpt"}}), tmp_path,
                            cluster.kubeconfig, "-n", ns.namespace))
    assert any("ckpt is ReadWriteOnce" in line and "use a ReadWriteMany claim" in line for line in found), found

    wild = manifest("wild", roles={"critic": {"tolerations": [{"operator": "Exists"}]}})  # the chart's job policy
    found = errors(validate(wild, tmp_path, cluster.kubeconfig, "-n", ns.namespace))
    assert any(line.startswith("the API server refuses the job (a dry run)") and "tolerates every taint" in line
               for line in found), found

    found = errors(validate(manifest("nowhere"), tmp_path, cluster.kubeconfig, "-n", f"{ns.namespace}-not-there"))
    assert any(line.startswith(f"namespace {ns.namespace}-not-there does not exist") for line in found), found


def test_a_user_without_rights_is_told_so_and_what_was_not_checked(
    ns: Api, cluster: Cluster, release: str, tmp_path: Path
) -> None:
    ns.create(SERVICEACCOUNTS, {"metadata": {"name": "nobody"}})
    config = tmp_path / "nobody.kubeconfig"
    config.write_text(pki.kubeconfig(cluster.server, cluster.pki, token=ns.token(ns.namespace, "nobody")))
    proc = validate(manifest("no-rights"), tmp_path, config, "-n", ns.namespace)
    found = errors(proc)
    assert proc.returncode == 1 and len(found) == 1, proc.stderr
    assert found[0].startswith(f"you may not create RLTrainingJobs in namespace {ns.namespace}") and "RoleBinding" in \
        found[0]
    assert "note: cluster: not checked: nodes could not be read (403" in proc.stderr, proc.stderr


def test_a_job_this_cluster_can_run_passes_with_the_versions_found(
    ns: Api, cluster: Cluster, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    elected = OperatorProcess(operator_kubeconfig, tmp_path, extra=ELECTION)  # -A, as the chart's
    elected.start()  # an operator with a Lease, beside the session's: this test makes no job for either to act on
    try:
        wait_for(lambda: leading(elected), 30, "the elected operator to lead", elected.tail)
        proc = validate(manifest("can-run"), tmp_path, cluster.kubeconfig, "-n", ns.namespace)
        assert proc.returncode == 0 and not errors(proc), proc.stderr
        line = proc.stdout.strip().splitlines()[-1]
        assert line.startswith(f"cluster: namespace {ns.namespace} can run it: CRD kuberl.io v1alpha1"), line
        assert f"({OPERATOR_NAMESPACE}/{RELEASE})" in line and "KubeRay CRD ray.io/v1" in line, line
        assert not ns.list(RLTJ)
    finally:
        elected.stop()

"""DRA for real: the claims the operator renders are allocated from GPUs a DRA driver publishes on the real node,
and the pods that hold them start.

The driver is ours (cluster/gomod/fakegpu, on the upstream kubeletplugin library; `localkube.dra`): eight fake
GPUs on `node-0`, gpu-0 to gpu-3 under one PCIe root, gpu-4 to gpu-7 under the other. A job with
`placement.mode: dra` asks, per replica, for its GPUs on one PCIe root (the ResourceClaimTemplate's matchAttribute
on `resource.kubernetes.io/pcieRoot`): the actor's four and each critic replica's two. The scheduler allocates,
the kubelet asks the driver to prepare, and the containers start. There is no CUDA here, so the job itself is not
expected to train.
"""

from __future__ import annotations

from typing import Any

import pytest
from localkube import dra

from kuberl_operator import builders, names
from tests.cluster.waits import wait_for

from .conftest import Kubectl
from .test_real_pods import describe, others_gone, pods_by_role

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
JOB = "dra"
GPUS = {"actor": (1, 4), "critic": (2, 2)}  # role -> (replicas, GPUs a replica)
SMALL = {"cpu": "100m", "memory": "1Gi"}


def job() -> dict[str, Any]:
    roles = {r: {"replicas": n, "gpus": g, "resources": SMALL} for r, (n, g) in GPUS.items()}
    return {
        "apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": JOB},
        "spec": {
            "model": {"builtin": "tiny"},
            "data": {"task": "repeat-letter", "batchSize": 32, "maxPromptLength": 8},
            "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
            "rollout": {"engine": "hf", "maxNewTokens": 8},
            "trainer": {"steps": 2, "miniBatchSize": 32, "microBatchSize": 8},
            "placement": {"mode": "dra", "deviceClass": dra.DEVICE_CLASS},
            "roles": {**roles, "ref": {"resources": SMALL}, "reward": {"resources": SMALL}},
        },
    }


def started(k: Kubectl, pod: dict[str, Any]) -> bool:
    """The pod's main container ran (Running now, or a Started Event: without CUDA the job may end soon after)."""
    if pod["status"].get("phase") == "Running":
        return True
    events = k.list("events")
    return any(e["reason"] == "Started" and e["involvedObject"].get("name") == pod["metadata"]["name"] for e in events)


def test_the_operators_claims_are_allocated_on_one_pcie_root_and_their_pods_start(installed: Kubectl) -> None:
    k = installed.in_namespace(JOB)
    assert any(s["spec"]["driver"] == dra.DRIVER for s in k.list("resourceslices")), (
        "no ResourceSlice of the fake-GPU driver: `make cluster-build` builds it (cluster/gomod/fakegpu)")
    wait_for(lambda: others_gone(k), 180, "the earlier jobs' pods gone", lambda: describe(k, ""), interval=2)
    k("create", "namespace", JOB)
    k.apply(job())

    def gpu_pods() -> dict[str, list[dict[str, Any]]] | None:
        pods = {r: ps for r, ps in pods_by_role(k, JOB).items() if r in GPUS}
        ok = all(len(pods.get(r, [])) == n and all(started(k, p) for p in pods[r]) for r, (n, _) in GPUS.items())
        return pods if ok else None

    pods = wait_for(gpu_pods, 420, "every GPU pod started", lambda: describe(k, JOB), interval=1)
    templates = {t["metadata"]["name"]: t for t in k.list("resourceclaimtemplates")}
    roots = {d["name"]: d["attributes"][builders.DRA_ATTRIBUTES["pcieRoot"]]["string"]
             for s in k.list("resourceslices") if s["spec"]["driver"] == dra.DRIVER for d in s["spec"]["devices"]}
    assert sorted(set(roots.values())) == sorted(dra.PCIE_ROOTS), roots
    claims = {c["metadata"]["name"]: c for c in k.list("resourceclaims")}
    taken: list[str] = []
    for role, (_, gpus) in GPUS.items():
        template = templates[names.claim_template(JOB, role)]["spec"]["spec"]["devices"]
        assert template["constraints"] == [{"requests": [names.GPU_CLAIM],
                                            "matchAttribute": builders.DRA_ATTRIBUTES["pcieRoot"]}], template
        for pod in pods[role]:
            assert pod["spec"]["nodeName"] == "node-0", pod["spec"].get("nodeName")
            (status,) = pod["status"]["resourceClaimStatuses"]
            results = claims[status["resourceClaimName"]]["status"]["allocation"]["devices"]["results"]
            devices = [r["device"] for r in results if r["driver"] == dra.DRIVER]
            assert len(devices) == gpus and len({roots[d] for d in devices}) == 1, (role, devices, roots)
            print(f"{pod['metadata']['name']}: {', '.join(devices)} on {roots[devices[0]]}")
            taken += devices
    assert len(taken) == len(set(taken)) == dra.GPUS  # every fake GPU allocated once
    k.delete("rltj", JOB, wait=True)

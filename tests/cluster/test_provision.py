"""Install, apply, provision: the chart in a real API server, the example jobs through kubectl, KubeRay
turning the RayCluster into pods, the scheduler binding them to kwok GPU nodes."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from localkube.api import (
    CONFIGMAPS,
    JOBS,
    NAMESPACES,
    NETWORKPOLICIES,
    RAYCLUSTERS,
    RLTJ,
    ROLEBINDINGS,
    ROLES,
    SECRETS,
    SERVICEACCOUNTS,
    SERVICES,
    Api,
)

from .conftest import OPERATOR_NAMESPACE
from .jobs import describe, pods_of, status
from .operator_process import OperatorProcess
from .waits import wait_for

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.netns

CHILDREN = [
    (SERVICEACCOUNTS, "{}-driver"),
    (ROLES, "{}-driver"),
    (ROLEBINDINGS, "{}-driver"),
    (SECRETS, "{}-ray-auth"),
    (NETWORKPOLICIES, "{}-network"),
    (CONFIGMAPS, "{}-spec"),
    (CONFIGMAPS, "{}-progress"),
    (RAYCLUSTERS, "{}"),
    (JOBS, "{}-driver"),
]


def test_helm_install_makes_the_crd_and_the_operators_identity(admin: Api, release: str, kubectl) -> None:
    crd = admin.get("apiextensions.k8s.io/v1/customresourcedefinitions", "rltrainingjobs.kuberl.io", namespace=None)
    assert any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])
    assert admin.get(SERVICEACCOUNTS, release, namespace=OPERATOR_NAMESPACE) is not None
    assert admin.get(NAMESPACES, OPERATOR_NAMESPACE, namespace=None) is not None
    listing = kubectl("get", "crd", "rltrainingjobs.kuberl.io", "-o", "name").stdout
    assert listing.strip() == "customresourcedefinition.apiextensions.k8s.io/rltrainingjobs.kuberl.io"


def test_the_gpu_example_is_provisioned_on_gpu_nodes(ns: Api, operator: OperatorProcess, kubectl) -> None:
    name = "ppo-gpu"
    kubectl(
        "apply", "--server-side", "--validate=strict", "-n", ns.namespace, "-f", str(REPO / "examples" / "ppo-gpu.yaml")
    )
    job = ns.get(RLTJ, name)
    ctx = lambda: describe(ns, name) + operator.tail(30)  # noqa: E731
    wait_for(lambda: all(ns.get(res, pattern.format(name)) for res, pattern in CHILDREN), 60, "every child object", ctx)
    for res, pattern in CHILDREN:
        owners = ns.get(res, pattern.format(name))["metadata"]["ownerReferences"]
        assert [(o["kind"], o["uid"], o["controller"]) for o in owners] == [
            ("RLTrainingJob", job["metadata"]["uid"], True)
        ]

    # KubeRay: a head pod, one group of worker pods per role, the head Service.
    want = {"actor": 2, "critic": 2, "ref": 1, "reward": 1}
    wait_for(lambda: {r: len(pods_of(ns, name, r)) for r in want} == want, 60, "KubeRay's worker pods", ctx)
    head = wait_for(
        lambda: [p for p in pods_of(ns, name) if p["metadata"]["labels"].get("ray.io/node-type") == "head"],
        30,
        "the head pod",
        ctx,
    )
    assert len(head) == 1 and ns.get(SERVICES, f"{name}-head-svc") is not None

    # The scheduler bound every pod by its requests: GPU roles on GPU nodes (tolerating their taint).
    wait_for(lambda: status(ns, name).get("phase") == "Running", 60, "phase Running", ctx)
    for pod in pods_of(ns, name):
        role = pod["metadata"]["labels"].get("kuberl.io/role")
        node = pod["spec"]["nodeName"]
        gpus = pod["spec"]["containers"][0]["resources"].get("limits", {}).get("nvidia.com/gpu")
        assert (node.startswith("gpu-"), gpus) == (
            (True, "1") if role in ("actor", "critic", "ref") else (False, None)
        ), pod["metadata"]["name"]
        assert pod["status"]["phase"] == "Running"
    st = status(ns, name)
    assert {r: (s["desired"], s["ready"]) for r, s in st["roles"].items()} == {r: (n, n) for r, n in want.items()}

    # `kubectl get rltj`: the printer columns.
    table = kubectl("get", "rltj", "-n", ns.namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "STEP", "TOKENS/S", "RESTARTS", "AGE"], table
    assert table[1].split()[:2] == [name, "Running"] and table[1].split()[-2] == "0", table
    assert kubectl("get", "rltj", name, "-n", ns.namespace, "-o", "jsonpath={.status.roles.actor.ready}").stdout == "2"


def scheduled(pods: list[dict], count: int) -> list[dict]:
    """``pods`` once there are ``count`` of them and each has a node; else empty."""
    return pods if len(pods) == count and all(p["spec"].get("nodeName") for p in pods) else []


def test_kuberay_passes_the_role_resources_to_ray_start(ns: Api, operator: OperatorProcess, job_name: str) -> None:
    """Fact: KubeRay keeps the single-quoted rayStartParams.resources as one shell word of `ray start`."""
    from .jobs import manifest

    ns.create(RLTJ, manifest(job_name))
    pods = wait_for(
        lambda: scheduled(pods_of(ns, job_name, "critic"), 2),
        60,
        "the critic pods, scheduled",
        lambda: describe(ns, job_name),
    )
    for pod in pods:
        container = pod["spec"]["containers"][0]
        line = " ".join(container.get("command", []) + container.get("args", []))
        # The kubelet expands $(KUBERL_NODE_NAME) in args from the env the downward API fills; then the shell splits.
        expanded = line.replace("$(KUBERL_NODE_NAME)", pod["spec"]["nodeName"])
        words = shlex.split(expanded.split("ray start", 1)[1].split(";")[0].split("&&")[0])
        resources = [w.split("=", 1)[1] for w in words if w.startswith("--resources=")]
        assert len(resources) == 1, line
        assert json.loads(resources[0]) == {"kuberl_role_critic": 1, f"kuberl_node_{pod['spec']['nodeName']}": 1}, line
        assert "--num-gpus=1" in words, line

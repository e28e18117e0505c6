"""Colocated roles in the operator (spec.roles.<role>.colocateWith): one worker group for a host and its
guests, the Ray resources that tell them apart, GPUs once per pod; status and restarts per role."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kuberl.spec import validate_manifest
from kuberl.spec.colocation import set_bundle
from kuberl.spec.contract import RoleProgress
from kuberl.spec.quantity import parse_quantity
from kuberl_operator import builders
from kuberl_operator.health import PodView
from kuberl_operator.progress import Progress
from kuberl_operator.status import Observed, decide

OPTS = builders.BuildOptions(namespace="ml", image="runtime:1")
T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"
GPU2 = {"replicas": 2, "gpus": 1}


def job(roles: dict[str, Any] | None = None, **spec: Any):
    roles = roles if roles is not None else {
        "actor": {**GPU2, "resources": {"cpu": "4", "memory": "32Gi"}},
        "ref": {**GPU2, "colocateWith": "actor", "resources": {"cpu": "500m", "memory": "16Gi"}, "maxRestarts": 2},
        "critic": {**GPU2},
    }
    return validate_manifest({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
                              "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "m.n:f"},
                                       "trainer": {"microBatchSize": 1}, "roles": roles, **spec}})


def groups_of(j) -> dict[str, dict[str, Any]]:
    return {g["groupName"]: g for g in builders.ray_cluster(j, OPTS)["spec"]["workerGroupSpecs"]}


def compute(quantities: dict[str, Any]) -> dict[str, Any]:
    """Requests or limits without the ephemeral storage (the pod's scratch dirs: test_builders.py)."""
    return {k: v for k, v in quantities.items() if k != "ephemeral-storage"}


def ray_resources(group: dict[str, Any]) -> dict[str, int]:
    return json.loads(group["rayStartParams"]["resources"].strip("'"))


def test_worker_groups_are_the_hosts_and_carry_their_guests() -> None:
    j = job({"actor": GPU2, "ref": {**GPU2, "colocateWith": "actor"}, "critic": {**GPU2, "colocateWith": "actor"}})
    assert builders.hosts(j.spec) == ["actor", "reward"]
    assert builders.group_roles(j.spec, "actor") == ("actor", "critic", "ref")
    assert builders.group_roles(j.spec, "reward") == ("reward",)
    # A guest that does not run (replicas 0) leaves its host's group as it was.
    alone = job({"ref": {"replicas": 0, "colocateWith": "actor"}})
    assert builders.hosts(alone.spec) == ["actor", "critic", "reward"]
    assert builders.group_roles(alone.spec, "actor") == ("actor",)


def test_a_colocated_role_has_no_worker_group_and_runs_in_its_hosts(validator) -> None:
    objs = builders.all_objects(job(), {}, "t", OPTS)
    (cluster,) = [o for o in objs if o["kind"] == "RayCluster"]
    assert validator(cluster) == []
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    assert list(groups) == ["actor", "critic", "reward"]  # one group carries actor and ref
    actor = groups["actor"]
    assert (actor["replicas"], actor["minReplicas"], actor["maxReplicas"]) == (2, 2, 2)
    # Ray tells the roles apart: a unit of each role's resource per GPU of the pod.
    assert ray_resources(actor) == {"kuberl_role_actor": 1, "kuberl_role_ref": 1, "kuberl_node_$(KUBERL_NODE_NAME)": 1}
    assert ray_resources(groups["critic"]) == {"kuberl_role_critic": 1, "kuberl_node_$(KUBERL_NODE_NAME)": 1}
    # GPUs once per pod (the host's), CPU and memory for both roles' processes.
    container = actor["template"]["spec"]["containers"][0]
    assert compute(container["resources"]["limits"]) == {"cpu": "4500m", "memory": "48Gi", "nvidia.com/gpu": 1}
    assert compute(container["resources"]["requests"]) == compute(container["resources"]["limits"])
    assert actor["rayStartParams"]["num-gpus"] == "1"
    assert actor["template"]["metadata"]["labels"]["kuberl.io/role"] == "actor"
    total = sum(g["replicas"] * g["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", 0)
                for g in groups.values())
    assert total == 4  # actor 2 + critic 2; the ref's GPUs are the actor's


def test_the_colocated_example_needs_two_gpus_where_the_plain_one_needs_five() -> None:
    from pathlib import Path

    from kuberl.spec import load_manifest

    examples = Path(__file__).resolve().parents[2] / "examples"
    gpus = {}
    for name in ("ppo-gpu.yaml", "ppo-gpu-colocated.yaml"):
        found = groups_of(load_manifest(examples / name))
        gpus[name] = sum(g["replicas"] * g["template"]["spec"]["containers"][0]["resources"]["limits"].get(
            "nvidia.com/gpu", 0) for g in found.values())
    assert gpus == {"ppo-gpu.yaml": 5, "ppo-gpu-colocated.yaml": 2}
    assert list(found) == ["actor", "reward"]
    assert compute(found["actor"]["template"]["spec"]["containers"][0]["resources"]["limits"]) == {
        "cpu": "20", "memory": "128Gi", "nvidia.com/gpu": 1}


def test_two_guests_share_the_hosts_gpus_and_sum_their_resources() -> None:
    res = {"cpu": "1", "memory": "1Gi"}
    j = job({"actor": {"replicas": 1, "gpus": 4, "resources": res}, "ref": {"replicas": 1, "gpus": 4,
             "colocateWith": "actor", "resources": {"cpu": "250m", "memory": "512Mi"}},
             "critic": {"replicas": 1, "gpus": 4, "colocateWith": "actor", "resources": res}})
    groups = groups_of(j)
    assert list(groups) == ["actor", "reward"]
    actor = groups["actor"]
    assert ray_resources(actor) == {"kuberl_role_actor": 4, "kuberl_role_critic": 4, "kuberl_role_ref": 4,
                                    "kuberl_node_$(KUBERL_NODE_NAME)": 4}
    limits = actor["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert compute(limits) == {"cpu": "2250m", "memory": "2560Mi", "nvidia.com/gpu": 4}
    assert actor["rayStartParams"]["num-gpus"] == "4"
    assert parse_quantity(limits["memory"]) == parse_quantity("1Gi") * 2 + parse_quantity("512Mi")


def test_a_cpu_role_colocated_with_another_cpu_role() -> None:
    j = job({"reward": {"colocateWith": "ref", "resources": {"cpu": "250m", "memory": "1Gi"}},
             "ref": {"resources": {"cpu": "1", "memory": "2Gi"}}})
    groups = groups_of(j)
    assert list(groups) == ["actor", "critic", "ref"]
    assert ray_resources(groups["ref"]) == {"kuberl_role_ref": 1, "kuberl_role_reward": 1,
                                            "kuberl_node_$(KUBERL_NODE_NAME)": 1}
    limits = groups["ref"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert compute(limits) == {"cpu": "1250m", "memory": "3Gi"} and groups["ref"]["rayStartParams"]["num-gpus"] == "0"


def test_under_dra_a_colocated_role_gets_no_claim_template_of_its_own(validator) -> None:
    j = job(placement={"mode": "dra"})
    templates = builders.gpu_claim_templates(j, OPTS)
    assert [t["metadata"]["name"] for t in templates] == ["j-actor-gpus", "j-critic-gpus"]
    actor = groups_of(j)["actor"]
    claims = actor["template"]["spec"]["resourceClaims"]
    assert claims == [{"name": "gpus", "resourceClaimTemplateName": "j-actor-gpus"}]
    assert "nvidia.com/gpu" not in actor["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert all(validator(t) == [] for t in templates)


@pytest.mark.parametrize("roles", [
    {"actor": GPU2, "ref": {**GPU2, "colocateWith": "actor"}, "critic": {**GPU2, "colocateWith": "actor"}},
    {"actor": {"replicas": 1, "gpus": 2}, "ref": {"replicas": 1, "gpus": 2, "colocateWith": "actor"}},
    {"ref": {"colocateWith": "actor"}, "reward": {"colocateWith": "actor"}},
])
def test_the_runtimes_placement_bundles_fill_the_pods_of_the_group(roles: dict[str, Any]) -> None:
    """The runtime's side of the contract: its placement group for a group's roles has one bundle per rank
    (`kuberl.spec.colocation.set_bundle`: rank r of every role of the group); one pod holds max(gpus, 1) of them,
    exactly: every custom resource, the GPUs, and the CPUs (KubeRay gives Ray the container's CPU limit)."""
    j = job(roles)
    for host, group in groups_of(j).items():
        per_pod = max(j.spec.roles.get(host).gpus, 1)
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        pod = {**ray_resources(group), "CPU": float(parse_quantity(limits["cpu"])),
               "GPU": float(group["rayStartParams"]["num-gpus"])}
        asked = {key: per_pod * amount for key, amount in set_bundle(j.spec, host).items()}
        assert asked == {key: value for key, value in pod.items() if key in asked and value}, (host, asked, pod)
        assert set(pod) - set(asked) <= {"kuberl_node_$(KUBERL_NODE_NAME)", "GPU"}


def pod(name: str, role: str, failure: str | None = None) -> PodView:
    return PodView(name=name, uid=f"u-{name}", role=role, owner="rc", ready=failure is None, failure=failure,
                   deleting=False)


def pods(failed: dict[str, str] | None = None) -> tuple[PodView, ...]:
    """The pods of job(): actor's two (which carry ref), critic's two, reward's one; no ref pods."""
    failed = failed or {}
    names = {"actor": ["a0", "a1"], "critic": ["c0", "c1"], "reward": ["w0"]}
    return tuple(pod(n, role, failed.get(n)) for role, ns in names.items() for n in ns)


def running() -> dict[str, Any]:
    return decide(job(), 1, decide(job(), 1, {}, Observed("rc", pods()), T0).status, Observed("rc", pods()), T0).status


def test_a_colocated_role_is_ready_with_its_hosts_pods() -> None:
    prov = decide(job(), 1, {}, Observed("rc", pods()[2:]), T0).status  # the actor's pods are not there yet
    assert prov["phase"] == "Provisioning" and "actor 0/2" in prov["message"] and "ref 0/2" in prov["message"]
    st = running()
    assert st["phase"] == "Running" and st["message"] == "all 4 roles ready"
    assert st["roles"]["ref"]["colocatedWith"] == "actor" and "colocatedWith" not in st["roles"]["actor"]
    assert (st["roles"]["ref"]["desired"], st["roles"]["ref"]["ready"]) == (2, 2)
    assert set(st["roles"]["ref"]["members"]) == {"u-a0", "u-a1"}


def test_a_failure_of_the_colocated_roles_processes_touches_no_pod() -> None:
    """The driver restarts the ref's Ray actors on the same pods and says so in its report: the operator
    mirrors the ref's restart and deletes nothing; the actor keeps its pods and its count."""
    report = Progress(step=4, roles={"ref": RoleProgress(restarts=1, last_failure="WorkerDied at step 3 (ref): a rank "
                                                                                  "died")})
    decision = decide(job(), 1, running(), Observed("rc", pods(), report), T1)
    st = decision.status
    assert decision.delete_pods == () and st["phase"] == "Running"
    assert {r: s["restarts"] for r, s in st["roles"].items()} == {"actor": 0, "critic": 0, "ref": 1, "reward": 0}
    assert st["roles"]["ref"]["podRestarts"] == 0 and "WorkerDied" in st["roles"]["ref"]["lastFailure"]
    assert [e.reason for e in decision.events] == ["RoleFailed"] and "role ref" in decision.events[0].message


def test_a_host_pod_failure_is_a_failure_of_both_roles_and_its_pods_go_once() -> None:
    failed = {"a1": "container ray-worker exited with code 1"}
    decision = decide(job(), 1, running(), Observed("rc", pods(failed)), T1)
    st = decision.status
    assert decision.delete_pods == ("a0", "a1")  # the shared gang, each pod once
    assert {r: s["restarts"] for r, s in st["roles"].items()} == {"actor": 1, "critic": 0, "ref": 1, "reward": 0}
    assert st["phase"] == "Restarting" and st["restarts"] == 2
    assert all("pod a1" in st["roles"][r]["lastFailure"] for r in ("actor", "ref"))
    restarts = {e.message.split(":")[0]: e.message for e in decision.events if e.reason == "RoleRestart"}
    assert set(restarts) == {"role actor", "role ref"}
    assert "role actor's pods (colocateWith)" in restarts["role ref"]
    assert "with every role on them" in restarts["role ref"]
    # The driver then restarts both roles' processes and counts one restart each: no role is counted twice.
    report = Progress(roles={"actor": RoleProgress(restarts=1), "ref": RoleProgress(restarts=1)})
    fresh = (*pods()[2:], pod("a2", "actor"), pod("a3", "actor"))
    again = decide(job(), 1, st, Observed("rc", fresh, report), T2)
    back = decide(job(), 1, again.status, Observed("rc", fresh, report), T2).status
    assert back["phase"] == "Running" and back["restarts"] == 2
    assert {r: back["roles"][r]["restarts"] for r in ("actor", "ref")} == {"actor": 1, "ref": 1}


def test_a_host_pod_failure_charges_the_colocated_roles_own_budget() -> None:
    roles = {"actor": GPU2, "ref": {**GPU2, "colocateWith": "actor", "maxRestarts": 0}}
    j = job(roles, algorithm={"name": "grpo", "groupSize": 2})
    seen = Observed("rc", (pod("a0", "actor"), pod("a1", "actor"), pod("w0", "reward")))
    st = decide(j, 1, decide(j, 1, {}, seen, T0).status, seen, T0).status
    assert st["phase"] == "Running"
    broken = Observed("rc", (pod("a0", "actor", "evicted"), pod("a1", "actor"), pod("w0", "reward")))
    decision = decide(j, 1, st, broken, T1)
    assert decision.status["phase"] == "Failed" and decision.delete_pods == () and decision.teardown
    assert "spec.roles.ref.maxRestarts (0)" in decision.status["message"]


def test_the_colocated_roles_status_is_declared_in_the_crd() -> None:
    """A real API server prunes undeclared status fields: colocatedWith must be in the CRD."""
    from kuberl.spec import generate_crd

    from .schemas import CrdSchema

    j = job()
    body = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
            "spec": j.spec.model_dump(mode="json", by_alias=True, exclude_none=True), "status": running()}
    assert body["status"]["roles"]["ref"]["colocatedWith"] == "actor"
    assert CrdSchema(generate_crd(), "v1alpha1").problems(body) == []

"""Spec -> manifests, without a server: shapes, and validity against the real schemas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kuberl.spec import load_manifest, validate_manifest

from kuberl_operator import builders, names

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
OPTS = builders.BuildOptions(namespace="ml", image="runtime:1")


def job(**spec: Any):
    base = {"data": {"task": "repeat-letter"}, "reward": {"function": "kuberl.rewards.builtin:repeat_letter"}}
    return validate_manifest({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob",
                              "metadata": {"name": "j"}, "spec": {**base, **spec}})


def by_kind(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objs}


@pytest.mark.parametrize("example", ["ppo-gpu.yaml", "quickstart.yaml", "grpo.yaml"])
def test_every_object_passes_its_schema(example: str, validator) -> None:
    manifest = load_manifest(EXAMPLES / example)
    raw = yaml.safe_load((EXAMPLES / example).read_text())["spec"]
    objs = builders.all_objects(manifest, raw, "token", OPTS)
    assert [o["kind"] for o in objs] == ["ServiceAccount", "Role", "RoleBinding", "Secret", "ConfigMap",
                                         "ConfigMap", "RayCluster", "Job"]
    for obj in objs:
        assert validator(obj) == [], (obj["kind"], validator(obj))
        assert obj["metadata"]["namespace"] == "ml"
        assert obj["metadata"]["labels"][names.LABEL_JOB] == manifest.metadata.name


def test_one_worker_group_per_enabled_role() -> None:
    ppo = builders.ray_cluster(job(), OPTS)["spec"]["workerGroupSpecs"]
    grpo = builders.ray_cluster(job(algorithm={"name": "grpo", "groupSize": 4}), OPTS)["spec"]["workerGroupSpecs"]
    assert [g["groupName"] for g in ppo] == ["actor", "critic", "ref", "reward"]
    assert [g["groupName"] for g in grpo] == ["actor", "ref", "reward"]


def test_worker_group_settings() -> None:
    spec = job(roles={"actor": {"replicas": 2, "gpus": 4, "resources": {"cpu": "16", "memory": "64Gi"}}},
               rollout={"engine": "hf", "tensorParallelSize": 2})
    groups = {g["groupName"]: g for g in builders.ray_cluster(spec, OPTS)["spec"]["workerGroupSpecs"]}
    actor, reward = groups["actor"], groups["reward"]
    assert (actor["replicas"], actor["minReplicas"], actor["maxReplicas"]) == (2, 2, 2)
    pod = actor["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": 4}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert pod["restartPolicy"] == "Never"
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["securityContext"]["runAsNonRoot"] is True and container["securityContext"]["allowPrivilegeEscalation"] is False
    assert actor["template"]["metadata"]["labels"][names.LABEL_ROLE] == "actor"
    assert json.loads(actor["rayStartParams"]["resources"].strip("'")) == {"kuberl_role_actor": 4}
    assert actor["rayStartParams"]["num-gpus"] == "4"
    # A CPU role: no GPU resource, no GPU toleration, one unit of its Ray resource per pod.
    assert "nvidia.com/gpu" not in reward["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert "tolerations" not in reward["template"]["spec"]
    assert json.loads(reward["rayStartParams"]["resources"].strip("'")) == {"kuberl_role_reward": 1}


def test_worker_groups_advertise_the_role_resource_the_runtime_requests() -> None:
    from kuberl.spec import role_resource

    rc = by_kind(builders.all_objects(job(), {}, "s3cret", OPTS))["RayCluster"]
    for group in rc["spec"]["workerGroupSpecs"]:
        assert role_resource(group["groupName"]) in group["rayStartParams"]["resources"]


def test_head_does_no_work_and_everything_shares_the_ray_token() -> None:
    objs = by_kind(builders.all_objects(job(), {}, "s3cret", OPTS))
    head = objs["RayCluster"]["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    secret = objs["Secret"]
    assert secret["stringData"] == {"auth_token": "s3cret"}
    containers = [head["template"]["spec"]["containers"][0], objs["Job"]["spec"]["template"]["spec"]["containers"][0],
                  *(g["template"]["spec"]["containers"][0] for g in objs["RayCluster"]["spec"]["workerGroupSpecs"])]
    for c in containers:
        env = {e["name"]: e for e in c["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]


def test_driver_job_runs_kuberl_against_the_head_with_the_spec_mounted() -> None:
    objs = by_kind(builders.all_objects(job(), {}, "t", OPTS))
    pod = objs["Job"]["spec"]["template"]["spec"]
    driver = pod["containers"][0]
    assert driver["command"] == ["kuberl", "run", "/etc/kuberl/job.yaml", "--ray-address", "j-head-svc:6379",
                                 "--out", "/kuberl/out", "--no-progress"]
    env = {e["name"]: e for e in driver["env"]}
    assert env["KUBERL_PROGRESS_CONFIGMAP"]["value"] == "j-progress"
    assert env["KUBERL_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert {"name": "spec", "configMap": {"name": "j-spec"}} in pod["volumes"]
    assert pod["serviceAccountName"] == "j-driver" and pod["restartPolicy"] == "Never"
    assert "j-head-svc" in pod["initContainers"][0]["command"][-1]
    # `kuberl run` exits 3 when the job failed for good: no retries then; evictions cost no retry.
    rules = objs["Job"]["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "FailJob", "onExitCodes": {"containerName": "driver", "operator": "In", "values": [3]}}
    assert rules[1]["action"] == "Ignore" and rules[1]["onPodConditions"][0]["type"] == "DisruptionTarget"


def test_driver_may_only_get_and_patch_its_progress_configmap() -> None:
    role = by_kind(builders.driver_rbac(job(), OPTS))["Role"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["j-progress"],
                              "verbs": ["get", "patch"]}]


def test_spec_configmap_round_trips_through_validation() -> None:
    raw = {"data": {"task": "repeat-letter"}, "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
           "trainer": {"steps": 5}}
    cm = builders.spec_configmap(job(**raw), raw, OPTS)
    again = validate_manifest(yaml.safe_load(cm["data"]["job.yaml"]))
    assert again.spec == job(**raw).spec and again.metadata.name == "j" and again.metadata.namespace == "ml"

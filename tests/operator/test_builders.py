"""Spec -> manifests, without a server: shapes, and validity against the real schemas."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.spec import load_manifest, validate_manifest
from kuberl.spec.quantity import parse_quantity
from kuberl_operator import builders, names
from kuberl_operator.network import Scrapers

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
OPTS = builders.BuildOptions(namespace="ml", image="runtime:1")


def job(**spec: Any):
    base = {"data": {"task": "repeat-letter"}, "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
            "trainer": {"microBatchSize": 1}}  # divides the batch for GPU layouts up to 16 ranks
    return validate_manifest({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob",
                              "metadata": {"name": "j"}, "spec": {**base, **spec}})


def by_kind(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objs}


def spec_of(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest the driver reads, from the spec ConfigMap."""
    (cm,) = [o for o in objs if o["metadata"]["name"] == names.spec_configmap("j")]
    return yaml.safe_load(cm["data"][names.SPEC_FILE])


def expand(text: str, env: dict[str, str]) -> str:
    """What the kubelet does to a container's command and args: $(VAR) from its env, $$ -> $."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


@pytest.mark.parametrize("example", ["ppo-gpu.yaml", "quickstart.yaml", "grpo.yaml", "ppo-gpu-dra.yaml",
                                     "ppo-gpu-colocated.yaml"])
def test_every_object_passes_its_schema(example: str, validator) -> None:
    manifest = load_manifest(EXAMPLES / example)
    raw = yaml.safe_load((EXAMPLES / example).read_text())["spec"]
    objs = builders.all_objects(manifest, raw, "token", OPTS)
    claims = ["ResourceClaimTemplate"] * 3 if manifest.spec.placement.mode == "dra" else []  # actor, critic, ref
    assert [o["kind"] for o in objs] == ["ServiceAccount", "Role", "RoleBinding", "NetworkPolicy", "Secret",
                                         "ConfigMap", "ConfigMap", *claims, "RayCluster", "Job"]
    for obj in objs:
        assert validator(obj) == [], (obj["kind"], validator(obj))
        assert obj["metadata"]["namespace"] == "ml"
        assert obj["metadata"]["labels"][names.LABEL_JOB] == manifest.metadata.name


def test_one_worker_group_per_enabled_role() -> None:
    ppo = builders.ray_cluster(job(), OPTS)["spec"]["workerGroupSpecs"]
    grpo = builders.ray_cluster(job(algorithm={"name": "grpo", "groupSize": 4}), OPTS)["spec"]["workerGroupSpecs"]
    assert [g["groupName"] for g in ppo] == ["actor", "critic", "ref", "reward"]
    assert [g["groupName"] for g in grpo] == ["actor", "ref", "reward"]


def test_an_environment_gets_a_cpu_worker_group_of_its_own_with_no_api_token() -> None:
    spec = job(environment={"module": "tools", "maxTurns": 2, "maxTokensPerTurn": 16}, rollout={"maxNewTokens": 64},
               roles={"env": {"replicas": 3, "resources": {"cpu": "2", "memory": "1Gi"}}})
    groups = {g["groupName"]: g for g in builders.ray_cluster(spec, OPTS)["spec"]["workerGroupSpecs"]}
    assert list(groups) == ["actor", "critic", "ref", "reward", "env"]
    env = groups["env"]
    pod, (container,) = env["template"]["spec"], env["template"]["spec"]["containers"]
    assert (env["replicas"], env["minReplicas"], env["maxReplicas"]) == (3, 3, 3)
    assert container["resources"]["limits"]["cpu"] == "2" and "nvidia.com/gpu" not in container["resources"]["limits"]
    assert pod["automountServiceAccountToken"] is False and "tolerations" not in pod
    assert json.loads(env["rayStartParams"]["resources"].strip("'"))["kuberl_role_env"] == 1
    off = job(environment={"module": "tools", "maxTurns": 2, "maxTokensPerTurn": 16}, rollout={"maxNewTokens": 64},
              roles={"env": {"enabled": False}})
    assert "env" not in [g["groupName"] for g in builders.ray_cluster(off, OPTS)["spec"]["workerGroupSpecs"]]


def test_worker_group_settings() -> None:
    spec = job(roles={"actor": {"replicas": 2, "gpus": 4, "resources": {"cpu": "16", "memory": "64Gi"}}},
               rollout={"engine": "hf", "tensorParallelSize": 2}, trainer={"microBatchSize": 2})
    groups = {g["groupName"]: g for g in builders.ray_cluster(spec, OPTS)["spec"]["workerGroupSpecs"]}
    actor, reward = groups["actor"], groups["reward"]
    assert (actor["replicas"], actor["minReplicas"], actor["maxReplicas"]) == (2, 2, 2)
    pod = actor["template"]["spec"]
    container = pod["containers"][0]
    # ephemeral storage: tmp 16Gi + cache 32Gi + checkpoints 64Gi (no claim) + 1Gi of logs; shm is memory
    assert container["resources"]["limits"] == {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": 4,
                                                "ephemeral-storage": "113Gi"}
    assert container["resources"]["requests"] == {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": 4,
                                                  "ephemeral-storage": "1Gi"}  # Guaranteed: cpu, memory
    assert pod["restartPolicy"] == "Never"
    assert pod["terminationGracePeriodSeconds"] == 5  # nothing to finish: its state is in the per-step snapshots
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert actor["template"]["metadata"]["labels"][names.LABEL_ROLE] == "actor"
    assert json.loads(actor["rayStartParams"]["resources"].strip("'")) == {"kuberl_role_actor": 4,
                                                                          "kuberl_node_$(KUBERL_NODE_NAME)": 4}
    assert actor["rayStartParams"]["num-gpus"] == "4"
    # A CPU role: no GPU resource, no GPU toleration, one unit of its Ray resource per pod.
    assert "nvidia.com/gpu" not in reward["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert "tolerations" not in reward["template"]["spec"]
    assert json.loads(reward["rayStartParams"]["resources"].strip("'")) == {"kuberl_role_reward": 1,
                                                                           "kuberl_node_$(KUBERL_NODE_NAME)": 1}


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
    assert secret["stringData"] == {"auth_token": "s3cret"} and secret["immutable"] is True
    pods = [head["template"]["spec"], objs["Job"]["spec"]["template"]["spec"],
            *(g["template"]["spec"] for g in objs["RayCluster"]["spec"]["workerGroupSpecs"])]
    for pod in pods:
        volume = next(v for v in pod["volumes"] if "secret" in v)
        assert volume["secret"]["secretName"] == secret["metadata"]["name"]
        c = pod["containers"][0]
        env = {e["name"]: e for e in c["env"]}
        mount = next(m for m in c["volumeMounts"] if m["name"] == volume["name"])
        assert mount["readOnly"] and env["RAY_AUTH_MODE"]["value"] == "token"
        # a file, never an environment variable that child processes and crash reports would carry
        assert env["RAY_AUTH_TOKEN_PATH"]["value"] == f"{mount['mountPath']}/{volume['secret']['items'][0]['path']}"
        assert "RAY_AUTH_TOKEN" not in env


def test_the_network_policy_admits_the_jobs_own_pods_and_prometheus_on_the_metrics_ports() -> None:
    """Every pod of the job is selected (they all carry its label); its own pods reach every port, the Prometheus
    namespaces only the ports named `metrics` (the driver's and KubeRay's); nothing else is admitted."""
    scrapers = Scrapers(("monitoring", "obs", "monitoring"), ("192.0.2.0/24",))
    opts = builders.BuildOptions(namespace="ml", scrapers=scrapers)
    objs = builders.all_objects(job(), {}, "token", opts)
    policy = by_kind(objs)["NetworkPolicy"]
    selected = {names.LABEL_JOB: "j"}
    assert policy["metadata"]["name"] == "j-network" and policy["spec"]["podSelector"] == {"matchLabels": selected}
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open: storage, hubs, the API
    own, scrape = policy["spec"]["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": selected}}]}  # no ports: every port
    assert scrape["from"] == [{"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring", "obs"]}]}},
        {"ipBlock": {"cidr": "192.0.2.0/24"}}]
    assert scrape["ports"] == [{"protocol": "TCP", "port": "metrics"}]
    pods = [objs[-2]["spec"]["headGroupSpec"]["template"], objs[-1]["spec"]["template"],
            *(g["template"] for g in objs[-2]["spec"]["workerGroupSpecs"])]
    for pod in pods:
        assert pod["metadata"]["labels"][names.LABEL_JOB] == "j"
    driver = objs[-1]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "metrics", "containerPort": names.DRIVER_METRICS_PORT} in driver["ports"]
    # no Prometheus namespace: the metrics ports too are the job's own; off: no policy at all
    closed = by_kind(builders.all_objects(job(), {}, None, builders.BuildOptions(namespace="ml")))["NetworkPolicy"]
    assert closed["spec"]["ingress"] == [own]
    off = builders.BuildOptions(namespace="ml", network_policy=False)
    assert "NetworkPolicy" not in by_kind(builders.all_objects(job(), {}, None, off))


def test_render_prints_no_secret() -> None:
    """Without a token (`kuberl render`) there is no Secret: the operator makes it, with a token of its own."""
    assert "Secret" not in by_kind(builders.all_objects(job(), {}, None, OPTS))


def test_driver_job_runs_kuberl_against_the_head_with_the_spec_mounted() -> None:
    objs = by_kind(builders.all_objects(job(), {}, "t", OPTS))
    pod = objs["Job"]["spec"]["template"]["spec"]
    driver = pod["containers"][0]
    assert driver["args"] == ["kuberl", "run", "/etc/kuberl/job.yaml", "--ray-address", "j-head-svc:6379",
                              "--out", "/kuberl/out", "--no-progress", "--no-export", "--metrics-port", "9500",
                              "--metrics-address", "0.0.0.0"]
    # A Ray driver needs a raylet on its own machine: the pod joins the cluster (no CPUs) first, then execs it.
    assert driver["command"][:2] == ["sh", "-c"] and "ray start --address=j-head-svc:6379 --num-cpus=0" in (
        driver["command"][2]) and driver["command"][2].endswith('exec "$@"')
    env = {e["name"]: e for e in driver["env"]}
    assert env["KUBERL_PROGRESS_DIR"]["value"] == "/run/kuberl/progress" and "KUBERL_PROGRESS_CONFIGMAP" not in env
    assert {"name": "progress", "mountPath": "/run/kuberl/progress"} in driver["volumeMounts"]
    # The reporter sidecar relays the driver's reports from that folder to the ConfigMap, with the token.
    reporter = pod["initContainers"][-1]
    assert reporter["name"] == "reporter" and reporter["restartPolicy"] == "Always"  # a native sidecar
    assert reporter["command"] == ["kuberl", "report-progress", "--dir", "/run/kuberl/progress"]
    assert reporter["image"] == driver["image"]
    env = {e["name"]: e for e in reporter["env"]}
    assert env["KUBERL_PROGRESS_CONFIGMAP"]["value"] == "j-progress"
    assert env["KUBERL_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert pod["terminationGracePeriodSeconds"] >= 36  # the final report's retries fit before the kill
    assert {"name": "spec", "configMap": {"name": "j-spec"}} in pod["volumes"]
    # No checkpoint PVC: metrics.jsonl and the reward curve go to an emptyDir of the driver pod.
    assert {"name": "out", "emptyDir": {"sizeLimit": "1Gi"}} in pod["volumes"]
    assert {"name": "out", "mountPath": "/kuberl/out"} in driver["volumeMounts"]
    assert pod["serviceAccountName"] == "j-driver" and pod["restartPolicy"] == "Never"
    assert "j-head-svc" in pod["initContainers"][0]["command"][-1]
    # `kuberl run` exits 3 when the job failed for good: no retries then; evictions cost no retry.
    rules = objs["Job"]["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "FailJob",
                        "onExitCodes": {"containerName": "driver", "operator": "In", "values": [1, 3]}}
    assert rules[1]["action"] == "Ignore" and rules[1]["onPodConditions"][0]["type"] == "DisruptionTarget"
    assert rules[2] == {"action": "Ignore",  # a lost Ray node or cluster costs no retry
                        "onExitCodes": {"containerName": "driver", "operator": "In", "values": [6]}}


@pytest.mark.parametrize("joins_at, code, starts", [(1, 0, 1), (3, 0, 3), (None, 4, 3)])
def test_the_driver_tries_to_join_ray_three_times_then_exits_no_capacity(tmp_path: Path, joins_at: int | None,
                                                                         code: int, starts: int) -> None:
    """The driver's shell line, run with a `ray` that fails its first starts: it execs `kuberl run` once a join
    works, and after three failed joins exits 4 (retried) with the last `ray start` output."""
    fake = tmp_path / "ray"
    fake.write_text(f'#!/bin/sh\n[ "$1" = stop ] && exit 0\necho start >> {tmp_path}/starts\n'
                    f'echo "ray start output"\n[ $(wc -l < {tmp_path}/starts) -ge {joins_at or 99} ]\n')
    fake.chmod(0o755)
    line = builders.join_ray("j-head-svc:6379").replace("sleep 5", "sleep 0")
    done = subprocess.run(["sh", "-c", line, "join-ray", "echo", "kuberl run"], capture_output=True, text=True,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=30)
    assert done.returncode == code and len((tmp_path / "starts").read_text().split()) == starts, done
    assert ("kuberl run" in done.stdout) == (code == 0) and ("ray start output" in done.stdout) == (code == 4), done


def test_driver_may_only_get_and_patch_its_progress_configmap() -> None:
    role = by_kind(builders.driver_rbac(job(), OPTS))["Role"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["j-progress"],
                              "verbs": ["get", "patch"]}]


def test_spec_configmap_round_trips_through_validation() -> None:
    raw = {"data": {"task": "repeat-letter"}, "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
           "trainer": {"steps": 5}}
    cm = builders.spec_configmap(job(**raw), raw, OPTS)
    again = validate_manifest(yaml.safe_load(cm["data"]["job.yaml"]))
    no_path = {"trainer": {"checkpoint": {"path"}}}  # the ConfigMap adds the checkpoint volume's mount point
    assert again.spec.model_dump(exclude=no_path) == job(**raw).spec.model_dump(exclude=no_path)
    assert again.spec.trainer.checkpoint.path == "/checkpoints"
    assert again.metadata.name == "j" and again.metadata.namespace == "ml"


def test_workers_advertise_their_node_as_a_ray_resource() -> None:
    """The node is known only once the pod is scheduled: the downward API puts it in an env var and
    the kubelet expands $(KUBERL_NODE_NAME) in the `ray start` line KubeRay writes into the args."""
    from kuberl.spec.model import node_resource

    for group in builders.ray_cluster(job(roles={"actor": {"gpus": 2}}), OPTS)["spec"]["workerGroupSpecs"]:
        container = group["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        assert env[names.NODE_NAME_ENV] == {"name": "KUBERL_NODE_NAME",
                                            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
        # KubeRay's args: `ulimit -n 65536; ray start --resources='{...}' ...`; the shell strips the quotes.
        args = f"ulimit -n 65536; ray start --resources={group['rayStartParams']['resources']} --block"
        line = expand(args, {"KUBERL_NODE_NAME": "gpu-node-7.example.internal"})
        resources = json.loads(re.search(r"--resources='([^']*)'", line).group(1))
        units = 2 if group["groupName"] == "actor" else 1
        assert resources == {f"kuberl_role_{group['groupName']}": units,
                             node_resource("gpu-node-7.example.internal"): units}
        assert node_resource("n") == "kuberl_node_n"


def test_gpu_workers_get_host_memory_at_dev_shm_for_their_snapshots(validator) -> None:
    """A pod's own /dev/shm is 64 MiB: a GPU role's per-step snapshots (and NCCL) get a memory emptyDir there,
    charged to the pod; CPU roles keep theirs beside the checkpoints."""
    cluster = builders.ray_cluster(job(roles={"actor": {"gpus": 2}, "critic": {"gpus": 1}}), OPTS)
    for group in cluster["spec"]["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        shm = {v["name"]: v for v in pod["volumes"]}.get("shm")
        mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
        if group["groupName"] in ("actor", "critic"):
            memory = pod["containers"][0]["resources"]["limits"]["memory"]  # what a memory emptyDir counts against
            assert shm == {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": memory}}
            assert mounts["/dev/shm"] == "shm"
        else:
            assert shm is None and "/dev/shm" not in mounts
    assert validator(cluster) == []


def test_dra_gives_each_gpu_role_a_claim_template_instead_of_device_plugin_gpus(validator) -> None:
    spec = job(placement={"mode": "dra", "policy": "required", "minLink": "PIX"},
               roles={"actor": {"replicas": 2, "gpus": 4}, "critic": {"gpus": 1}, "ref": {"gpus": 2}})
    templates = {t["metadata"]["name"]: t for t in builders.gpu_claim_templates(spec, OPTS)}
    assert list(templates) == ["j-actor-gpus", "j-critic-gpus", "j-ref-gpus"]  # reward runs on CPU: none
    actor = templates["j-actor-gpus"]
    assert actor["apiVersion"] == "resource.k8s.io/v1" and actor["metadata"]["namespace"] == "ml"
    labels = actor["metadata"]["labels"]
    assert labels[names.LABEL_JOB] == "j" and labels[names.LABEL_ROLE] == "actor"
    assert actor["spec"]["spec"]["devices"] == {
        "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount",
                                                  "count": 4}}],
        "constraints": [{"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}],
    }
    # One GPU: no constraint (matchAttribute would also exclude GPUs that do not publish the attribute).
    assert "constraints" not in templates["j-critic-gpus"]["spec"]["spec"]["devices"]
    for template in templates.values():
        assert validator(template) == [], validator(template)

    groups = {g["groupName"]: g for g in builders.ray_cluster(spec, OPTS)["spec"]["workerGroupSpecs"]}
    for role in ("actor", "critic", "ref"):
        pod = groups[role]["template"]["spec"]
        container = pod["containers"][0]
        assert pod["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": f"j-{role}-gpus"}]
        assert container["resources"]["claims"] == [{"name": "gpus"}]
        assert "nvidia.com/gpu" not in container["resources"]["limits"]
        limits, requests = container["resources"]["limits"], container["resources"]["requests"]
        assert {k: v for k, v in limits.items() if k != "ephemeral-storage"} == {
            k: v for k, v in requests.items() if k != "ephemeral-storage"}
        assert groups[role]["rayStartParams"]["num-gpus"] == str(getattr(spec.spec.roles,
                                                                         role).gpus)  # KubeRay cannot infer it
    assert "resourceClaims" not in groups["reward"]["template"]["spec"]
    assert validator(builders.ray_cluster(spec, OPTS)) == []


def test_dra_constraint_and_device_class_follow_the_spec(validator) -> None:
    spec = job(placement={"mode": "dra", "draConstraint": "numaNode", "deviceClass": "h200.example.com"},
               roles={"actor": {"gpus": 2}})
    (template,) = builders.gpu_claim_templates(spec, OPTS)
    devices = template["spec"]["spec"]["devices"]
    assert devices["requests"][0]["exactly"]["deviceClassName"] == "h200.example.com"
    assert devices["constraints"][0]["matchAttribute"] == "resource.kubernetes.io/numaNode"
    assert validator(template) == []
    assert builders.gpu_claim_templates(job(roles={"actor": {"gpus": 2}}), OPTS) == []  # device-plugin mode


def test_the_jobs_own_image_overrides_the_operators() -> None:
    def images(objs: list[dict[str, Any]]) -> set[str]:
        rc, driver = by_kind(objs)["RayCluster"]["spec"], by_kind(objs)["Job"]["spec"]["template"]["spec"]
        pods = [rc["headGroupSpec"]["template"]["spec"], *(g["template"]["spec"] for g in rc["workerGroupSpecs"]),
                driver]
        return {c["image"] for p in pods for c in [*p["containers"], *p.get("initContainers", [])]}

    assert images(builders.all_objects(job(), {}, "t", OPTS)) == {"runtime:1"}
    assert images(builders.all_objects(job(image="registry.example.com/rl:2"), {}, "t",
                                       OPTS)) == {"registry.example.com/rl:2"}


def test_a_checkpoint_pvc_is_mounted_in_the_driver_and_every_worker(validator) -> None:
    """Each pod mounts the job's own folder of the PVC (a subPath), made first by an init container that sees the
    whole PVC and runs a fixed command, as the pods' user."""
    raw = {"data": {"task": "repeat-letter"}, "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
           "trainer": {"checkpoint": {"volumeClaim": "ckpt"}}}
    made = builders.all_objects(job(**raw), raw, "t", OPTS)
    objs = by_kind(made)
    volume = {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}}
    mount = {"name": "checkpoints", "mountPath": "/checkpoints", "subPath": "kuberl/j"}
    driver = objs["Job"]["spec"]["template"]["spec"]
    pods = [driver, *(g["template"]["spec"] for g in objs["RayCluster"]["spec"]["workerGroupSpecs"])]
    assert len(pods) == 5
    for pod in pods:
        assert volume in pod["volumes"] and mount in pod["containers"][0]["volumeMounts"]
        init = pod["initContainers"][0]
        assert init["name"] == "checkpoint-folder" and init["image"] == pod["containers"][0]["image"]
        assert init["volumeMounts"] == [{"name": "checkpoints", "mountPath": "/kuberl/claim"}]
        assert init["command"][-1] == "import os; os.makedirs('/kuberl/claim/kuberl/j', exist_ok=True)"
        assert init["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
    assert [c["name"] for c in driver["initContainers"]] == ["checkpoint-folder", "wait-for-ray", "reporter"]
    head = objs["RayCluster"]["spec"]["headGroupSpec"]["template"]["spec"]
    assert {v["name"] for v in head["volumes"]} == {"tmp", "cache", "ray-auth"}  # it does no work: no checkpoints
    # The driver reads the path from its spec: the mount point, since the manifest named none.
    assert spec_of(made)["spec"]["trainer"]["checkpoint"] == {"volumeClaim": "ckpt", "path": "/checkpoints"}
    assert validate_manifest(spec_of(made)).spec.trainer.checkpoint.path == "/checkpoints"
    assert raw["trainer"]["checkpoint"] == {"volumeClaim": "ckpt"}  # the caller's spec is not changed
    for obj in made:
        assert validator(obj) == [], (obj["kind"], validator(obj))

    # A path of its own is where the PVC goes.
    raw["trainer"]["checkpoint"]["path"] = "/mnt/ckpt"
    made = builders.all_objects(job(**raw), raw, "t", OPTS)
    driver = by_kind(made)["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "checkpoints", "mountPath": "/mnt/ckpt", "subPath": "kuberl/j"} in driver["volumeMounts"]
    assert spec_of(made)["spec"]["trainer"]["checkpoint"]["path"] == "/mnt/ckpt"


@pytest.mark.parametrize("path, out", [(None, "/checkpoints/runs/j"), ("/mnt/ckpt/", "/mnt/ckpt/runs/j")])
def test_with_a_checkpoint_pvc_the_driver_writes_its_artefacts_there(path, out) -> None:
    """metrics.jsonl and reward_curve.png outlive the driver pod: its --out is on the PVC, per job."""
    raw = {"trainer": {"checkpoint": {"volumeClaim": "ckpt", **({"path": path} if path else {})}}}
    objs = by_kind(builders.all_objects(job(**raw), raw, "t", OPTS))
    pod = objs["Job"]["spec"]["template"]["spec"]
    command = pod["containers"][0]["args"]
    assert command[command.index("--out") + 1] == out == builders.driver_out(job(**raw))
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}} in pod["volumes"]
    assert "out" not in {v["name"] for v in pod["volumes"]}  # no emptyDir left to lose them in
    claim = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "checkpoints")
    assert out.startswith(claim["mountPath"].rstrip("/") + "/runs/")


def test_without_a_checkpoint_pvc_every_pod_gets_a_writable_emptydir() -> None:
    """Workers write DCP shards at the checkpoint path: it must exist and be writable in every pod."""
    made = builders.all_objects(job(), {"trainer": {"steps": 3}}, "t", OPTS)
    objs = by_kind(made)
    volume = {"name": "checkpoints", "emptyDir": {"sizeLimit": "64Gi"}}
    mount = {"name": "checkpoints", "mountPath": "/checkpoints"}
    driver = objs["Job"]["spec"]["template"]["spec"]
    assert volume in driver["volumes"] and mount in driver["containers"][0]["volumeMounts"]
    for group in objs["RayCluster"]["spec"]["workerGroupSpecs"]:
        assert volume in group["template"]["spec"]["volumes"]
        assert mount in group["template"]["spec"]["containers"][0]["volumeMounts"]
    assert spec_of(made)["spec"] == {"trainer": {"steps": 3, "checkpoint": {"path": "/checkpoints"}}}


def test_only_the_reporter_mounts_an_api_token_and_every_root_filesystem_is_read_only() -> None:
    """User code runs in every Ray pod and in the driver container: none of them has an API token; the driver
    pod's reporter sidecar alone mounts its ServiceAccount's, as a projected volume."""
    objs = by_kind(builders.all_objects(job(), {}, "t", OPTS))
    rc, driver = objs["RayCluster"]["spec"], objs["Job"]["spec"]["template"]["spec"]
    ray_pods = [rc["headGroupSpec"]["template"]["spec"], *(g["template"]["spec"] for g in rc["workerGroupSpecs"])]
    assert all(p["automountServiceAccountToken"] is False for p in [*ray_pods, driver])
    assert driver["serviceAccountName"] == "j-driver"
    token = {v["name"]: v for v in driver["volumes"]}["api-token"]["projected"]["sources"]
    assert token[0]["serviceAccountToken"]["expirationSeconds"] <= 3607
    users = [c["name"] for p in [*ray_pods, driver] for c in [*p["containers"], *p.get("initContainers", [])]
             if any(m["name"] == "api-token" for m in c.get("volumeMounts", []))]
    assert users == ["reporter"], users
    assert {"name": "api-token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True} in (
        driver["initContainers"][-1]["volumeMounts"])
    for pod in [*ray_pods, driver]:
        for c in [*pod["containers"], *pod.get("initContainers", [])]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, c["name"]
        main = pod["containers"][0]
        mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
        assert mounts["/tmp"] == "tmp" and mounts["/kuberl/cache"] == "cache"  # Ray's /tmp/ray; caches
        assert {v["name"]: v for v in pod["volumes"]}["tmp"] == {"name": "tmp", "emptyDir": {"sizeLimit": "16Gi"}}
        env = {e["name"]: e.get("value") for e in main["env"]}
        assert env["XDG_CACHE_HOME"].startswith("/kuberl/cache") and env["HF_HOME"] == "/kuberl/cache/huggingface"


def test_every_emptydir_is_sized_and_every_container_limits_its_ephemeral_storage() -> None:
    """The kubelet evicts a pod whose emptyDir passes its sizeLimit, or whose ephemeral storage passes the sum
    of its containers' limits: a runaway spill or download cannot fill the node's disk (docs/security.md)."""
    for raw in ({}, {"trainer": {"checkpoint": {"volumeClaim": "ckpt"}}}):
        opts = builders.BuildOptions(namespace="ns", scratch={"tmp": "2Gi", "cache": "3Gi", "checkpoints": "5Gi",
                                                               "out": "512Mi"})
        objs = by_kind(builders.all_objects(job(roles={"actor": {"gpus": 1}}, **raw), {}, "t", opts))
        rc, driver = objs["RayCluster"]["spec"], objs["Job"]["spec"]["template"]["spec"]
        for pod in [rc["headGroupSpec"]["template"]["spec"], *(g["template"]["spec"] for g in rc["workerGroupSpecs"]),
                    driver]:
            dirs = {v["name"]: v["emptyDir"] for v in pod["volumes"] if "emptyDir" in v}
            assert dirs and all("sizeLimit" in d for d in dirs.values()), dirs
            disk = sum(parse_quantity(d["sizeLimit"]) for d in dirs.values() if d.get("medium") != "Memory")
            main = pod["containers"][0]["resources"]
            assert parse_quantity(main["limits"]["ephemeral-storage"]) == disk + 2**30  # and 1Gi of logs
            assert main["requests"]["ephemeral-storage"] == "1Gi"
            for init in pod.get("initContainers", []):
                storage = {k: {"ephemeral-storage": v.pop("ephemeral-storage")} for k, v in
                           copy.deepcopy(init["resources"]).items()}
                assert storage == {"requests": {"ephemeral-storage": "1Gi"}, "limits": {"ephemeral-storage": "1Gi"}}
        assert {v["name"]: v["emptyDir"] for v in driver["volumes"] if "emptyDir" in v}["tmp"] == {"sizeLimit": "2Gi"}


def test_credentials_are_secret_references_in_the_pods_that_use_them() -> None:
    """spec.credentials names Secrets: the hub token reaches the driver and every Ray pod (they load models), the
    trackers' the driver alone, each as valueFrom.secretKeyRef; no value is in any object rendered."""
    creds = {"huggingFace": {"name": "hf", "key": "token"}, "wandb": {"name": "wb", "key": "api-key"},
             "mlflow": {"name": "ml", "key": "t"}}
    objs = by_kind(builders.all_objects(job(credentials=creds), {"credentials": creds}, "t", OPTS))
    rc, driver = objs["RayCluster"]["spec"], objs["Job"]["spec"]["template"]["spec"]

    def refs(pod_or_container: dict) -> dict[str, dict]:
        container = pod_or_container["containers"][0] if "containers" in pod_or_container else pod_or_container
        return {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container.get("env", [])
                if "secretKeyRef" in e.get("valueFrom", {})}

    assert refs(driver) == {"HF_TOKEN": {"name": "hf", "key": "token"},
                            "WANDB_API_KEY": {"name": "wb", "key": "api-key"},
                            "MLFLOW_TRACKING_TOKEN": {"name": "ml", "key": "t"}}
    for group in rc["workerGroupSpecs"]:
        assert refs(group["template"]["spec"]) == {"HF_TOKEN": {"name": "hf", "key": "token"}}
    assert refs(rc["headGroupSpec"]["template"]["spec"]) == {}  # it loads no model
    assert refs(driver["initContainers"][-1]) == {}  # the reporter: only its API token
    assert not [e for pod in [driver] for e in pod["containers"][0]["env"] if "value" in e and e["name"] in
                ("HF_TOKEN", "WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN")]


def test_every_pod_template_carries_the_gang_gate_unless_gang_scheduling_is_off() -> None:
    j = job(roles={"actor": {"gpus": 1}, "critic": {"gpus": 1}})
    gate = [{"name": "kuberl.io/gang"}]
    cluster, driver = builders.ray_cluster(j, OPTS), builders.driver_job(j, OPTS)
    templates = [cluster["spec"]["headGroupSpec"]["template"], driver["spec"]["template"],
                 *(g["template"] for g in cluster["spec"]["workerGroupSpecs"])]
    assert all(t["spec"]["schedulingGates"] == gate for t in templates)
    off = builders.BuildOptions(namespace="ml", gang_scheduling=False)
    assert "schedulingGates" not in builders.driver_job(j, off)["spec"]["template"]["spec"]
    assert all("schedulingGates" not in g["template"]["spec"]
               for g in builders.ray_cluster(j, off)["spec"]["workerGroupSpecs"])


def test_a_queued_job_makes_its_raycluster_suspended_with_kueues_labels_and_topology() -> None:
    manifest = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob",
                "metadata": {"name": "j", "labels": {"kueue.x-k8s.io/queue-name": "team",
                                                     "kueue.x-k8s.io/priority-class": "batch", "team": "a"}},
                "spec": {"data": {"task": "repeat-letter"},
                         "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
                         "trainer": {"microBatchSize": 1},
                         "roles": {"actor": {"gpus": 1, "kueueTopology": {"required": "example.com/rack"}}}}}
    cluster = builders.ray_cluster(validate_manifest(manifest), OPTS)
    assert cluster["spec"]["suspend"] is True
    labels = cluster["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team" and labels["kueue.x-k8s.io/priority-class"] == "batch"
    assert "team" not in labels  # only Kueue's labels are passed on
    actor = next(g for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == "actor")
    assert actor["template"]["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-required-topology": "example.com/rack"}
    plain = builders.ray_cluster(job(), OPTS)
    assert "suspend" not in plain["spec"] and "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]

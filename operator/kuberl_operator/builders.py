"""Spec -> manifests: every object the operator creates for an RLTrainingJob, as plain dicts.

Pure functions in the style of KubeRay's ``controllers/ray/common``: no API calls, no owner
references (the handler adopts them), so `kuberl render` prints exactly what the operator applies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from kuberl.spec import API_VERSION, KIND, RLTrainingJob, RoleSpec, enabled_roles, role_resource

from . import names

DEFAULT_IMAGE = "ghcr.io/kuberl/kuberl-runtime:0.1.0"
HEAD_RESOURCES = {"cpu": "1", "memory": "4Gi"}
DRIVER_RESOURCES = {"cpu": "1", "memory": "4Gi"}
DRIVER_BACKOFF_LIMIT = 2
DRIVER_GAVE_UP = 3  # `kuberl run`'s exit code for a job that failed for good
RAY_UID = 1000  # the `ray` user of rayproject images
RAY_GID = 100


@dataclass(frozen=True)
class BuildOptions:
    """What the manifests need beyond the spec."""

    namespace: str
    image: str = DEFAULT_IMAGE
    pull_policy: str = "IfNotPresent"


def meta(name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": dict(labels)}


def pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": RAY_UID, "runAsGroup": RAY_GID, "fsGroup": RAY_GID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def ray_auth_env(job: str) -> list[dict[str, Any]]:
    """Ray 2.52+ token authentication: every Ray process and the driver share one token."""
    ref = {"name": names.auth_secret(job), "key": names.AUTH_TOKEN_KEY}
    return [{"name": "RAY_AUTH_MODE", "value": "token"},
            {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": ref}}]


def quantities(role: RoleSpec) -> dict[str, Any]:
    """Requests equal limits (Guaranteed QoS: a training pod is not the first one evicted)."""
    limits: dict[str, Any] = {"cpu": role.resources.cpu, "memory": role.resources.memory}
    if role.gpus:
        limits["nvidia.com/gpu"] = role.gpus
    return {"requests": dict(limits), "limits": limits}


def ray_resources_param(role: str, spec: RoleSpec) -> str:
    """rayStartParams.resources: one unit of the role's resource per GPU (or one on CPU), so the
    runtime's actors for this role, each asking for one unit, land only on this group's pods.
    Single-quoted: KubeRay pastes the value into a shell command line."""
    return "'" + json.dumps({role_resource(role): max(spec.gpus, 1)}, separators=(",", ":")) + "'"


def worker_group(job: RLTrainingJob, role: str, opts: BuildOptions) -> dict[str, Any]:
    """One KubeRay worker group per role: groupName = role, a fixed size, its own Ray resource."""
    spec: RoleSpec = getattr(job.spec.roles, role)
    name = job.metadata.name
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # a dead worker stays dead; the operator restarts the role as a gang
        "securityContext": pod_security(),
        "containers": [{
            "name": "ray-worker",
            "image": opts.image,
            "imagePullPolicy": opts.pull_policy,
            "resources": quantities(spec),
            "env": ray_auth_env(name),
            "securityContext": container_security(),
        }],
    }
    if spec.gpus:
        pod_spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "groupName": role,
        "replicas": spec.replicas,
        "minReplicas": spec.replicas,
        "maxReplicas": spec.replicas,
        "rayStartParams": {"resources": ray_resources_param(role, spec), "num-gpus": str(spec.gpus)},
        "template": {"metadata": {"labels": names.labels(name, "worker", role)}, "spec": pod_spec},
    }


def head_group(job: RLTrainingJob, opts: BuildOptions) -> dict[str, Any]:
    """The head runs the GCS and the dashboard and no work (num-cpus 0)."""
    name = job.metadata.name
    return {
        "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0"},
        "template": {
            "metadata": {"labels": names.labels(name, "head")},
            "spec": {
                "securityContext": pod_security(),
                "containers": [{
                    "name": "ray-head",
                    "image": opts.image,
                    "imagePullPolicy": opts.pull_policy,
                    "resources": {"requests": dict(HEAD_RESOURCES), "limits": dict(HEAD_RESOURCES)},
                    "ports": [{"name": "gcs", "containerPort": names.GCS_PORT},
                              {"name": "dashboard", "containerPort": 8265},
                              {"name": "client", "containerPort": 10001}],
                    "env": ray_auth_env(name),
                    "securityContext": container_security(),
                }],
            },
        },
    }


def ray_cluster(job: RLTrainingJob, opts: BuildOptions) -> dict[str, Any]:
    """A ray.io/v1 RayCluster: the head plus one worker group per enabled role."""
    name = job.metadata.name
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": meta(names.cluster(name), opts.namespace, names.labels(name, "ray-cluster")),
        "spec": {
            "headGroupSpec": head_group(job, opts),
            "workerGroupSpecs": [worker_group(job, role, opts) for role in enabled_roles(job.spec)],
        },
    }


def driver_job(job: RLTrainingJob, opts: BuildOptions) -> dict[str, Any]:
    """The driver (single controller) as a batch/v1 Job, like KubeRay's RayJob submitter."""
    name = job.metadata.name
    head = f"{names.head_service(name)}:{names.GCS_PORT}"
    wait_for_gcs = (
        "import socket, time\n"
        "while True:\n"
        "    try:\n"
        f"        socket.create_connection(({names.head_service(name)!r}, {names.GCS_PORT}), 2).close(); break\n"
        "    except OSError:\n"
        "        time.sleep(2)\n"
    )
    env = [
        {"name": "KUBERL_PROGRESS_CONFIGMAP", "value": names.progress_configmap(name)},
        {"name": "KUBERL_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        *ray_auth_env(name),
    ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(names.driver(name), opts.namespace, names.labels(name, "driver")),
        "spec": {
            "backoffLimit": DRIVER_BACKOFF_LIMIT,
            "podFailurePolicy": {"rules": [
                # `kuberl run` exits 3 when the job cannot go on (a spent budget, degraded placement):
                # retrying cannot help. An evicted or preempted driver does not use up a retry.
                {"action": "FailJob", "onExitCodes": {"containerName": "driver", "operator": "In",
                                                       "values": [DRIVER_GAVE_UP]}},
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]},
            "template": {
                "metadata": {"labels": names.labels(name, "driver")},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": names.driver(name),
                    "securityContext": pod_security(),
                    "initContainers": [{
                        "name": "wait-for-ray",
                        "image": opts.image,
                        "imagePullPolicy": opts.pull_policy,
                        "command": ["python", "-c", wait_for_gcs],
                        "securityContext": container_security(),
                    }],
                    "containers": [{
                        "name": "driver",
                        "image": opts.image,
                        "imagePullPolicy": opts.pull_policy,
                        "command": ["kuberl", "run", f"{names.SPEC_MOUNT}/{names.SPEC_FILE}",
                                    "--ray-address", head, "--out", names.OUT_DIR, "--no-progress"],
                        "env": env,
                        "resources": {"requests": dict(DRIVER_RESOURCES), "limits": dict(DRIVER_RESOURCES)},
                        "volumeMounts": [{"name": "spec", "mountPath": names.SPEC_MOUNT, "readOnly": True},
                                         {"name": "out", "mountPath": names.OUT_DIR}],
                        "securityContext": container_security(),
                    }],
                    "volumes": [{"name": "spec", "configMap": {"name": names.spec_configmap(name)}},
                                {"name": "out", "emptyDir": {}}],
                },
            },
        },
    }


def spec_configmap(job: RLTrainingJob, raw_spec: Mapping[str, Any], opts: BuildOptions) -> dict[str, Any]:
    """The job's manifest as the driver reads it: `kuberl run /etc/kuberl/job.yaml`."""
    name = job.metadata.name
    manifest = {"apiVersion": API_VERSION, "kind": KIND,
                "metadata": {"name": name, "namespace": opts.namespace}, "spec": dict(raw_spec)}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(names.spec_configmap(name), opts.namespace, names.labels(name, "spec")),
        "data": {names.SPEC_FILE: yaml.safe_dump(manifest, sort_keys=False)},
    }


def progress_configmap(job: RLTrainingJob, opts: BuildOptions) -> dict[str, Any]:
    """Where the driver reports progress (data.progress, JSON); the operator mirrors it to status."""
    name = job.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(names.progress_configmap(name), opts.namespace, names.labels(name, "progress")),
        "data": {"progress": "{}"},
    }


def driver_rbac(job: RLTrainingJob, opts: BuildOptions) -> list[dict[str, Any]]:
    """The driver's identity: it may get and patch its progress ConfigMap, and nothing else."""
    name = job.metadata.name
    sa_meta = meta(names.driver(name), opts.namespace, names.labels(name, "driver"))
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": sa_meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": dict(sa_meta),
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                       "resourceNames": [names.progress_configmap(name)], "verbs": ["get", "patch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": dict(sa_meta),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names.driver(name)},
            "subjects": [{"kind": "ServiceAccount", "name": names.driver(name), "namespace": opts.namespace}],
        },
    ]


def auth_secret(job: RLTrainingJob, token: str, opts: BuildOptions) -> dict[str, Any]:
    """The Ray auth token shared by the head, the workers and the driver."""
    name = job.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta(names.auth_secret(name), opts.namespace, names.labels(name, "ray-auth")),
        "type": "Opaque",
        "stringData": {names.AUTH_TOKEN_KEY: token},
    }


def runtime_objects(job: RLTrainingJob, opts: BuildOptions) -> list[dict[str, Any]]:
    """What suspend removes and resume recreates: the RayCluster and the driver Job."""
    return [ray_cluster(job, opts), driver_job(job, opts)]


def all_objects(job: RLTrainingJob, raw_spec: Mapping[str, Any], token: str, opts: BuildOptions) -> list[dict[str, Any]]:
    """Every object of a running job, in creation order (what `kuberl render` prints)."""
    return [
        *driver_rbac(job, opts),
        auth_secret(job, token, opts),
        spec_configmap(job, raw_spec, opts),
        progress_configmap(job, opts),
        *runtime_objects(job, opts),
    ]

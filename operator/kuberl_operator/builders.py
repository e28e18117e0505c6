"""Spec -> manifests: every object the operator creates for an RLTrainingJob, as plain dicts.

Pure functions in the style of KubeRay's ``controllers/ray/common``: no API calls, no owner
references (the handler adopts them), so `kuberl render` prints exactly what the operator applies.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from kuberl import logs
from kuberl.spec import API_VERSION, KIND, JobSpec, RLTrainingJob, RoleSpec, enabled_roles
from kuberl.spec.colocation import host_of, resized_live, set_bundle, sharing
from kuberl.spec.contract import PROGRESS_KEY, REPLICAS_KEY, Env, ExitCode, ReplicasDocument
from kuberl.spec.model import node_resource
from kuberl.spec.quantity import format_quantity, parse_quantity

from . import names
from .network import Scrapers, network_policy
from .scheduling import pod_scheduling
from .spec_changes import applied_annotation

DEFAULT_IMAGE = "ghcr.io/kuberl/kuberl-runtime:0.1.0"
HEAD_RESOURCES = {"cpu": "1", "memory": "4Gi"}
DRIVER_RESOURCES = {"cpu": "1", "memory": "4Gi"}
REPORTER_RESOURCES = {"cpu": "20m", "memory": "64Mi"}  # the reporter sidecar: 35 MB, 0.3 s of CPU to start
PROGRESS_SIZE = "16Mi"  # the reports' folder: two documents of at most 256 KiB
REPORTER_GRACE_S = 60  # the driver pod's: room for the reporter's final report, retried up to 35.5 s
# A role's pods: a role's state is in its per-step snapshots, so a deleted pod has nothing to finish, and Ray in the
# container (under KubeRay's bash) goes on through SIGTERM: each second of grace is a second its restart waits
# (under Kubernetes' default of 30 s a deleted pod's case took 43 s from the delete to its step's end).
WORKER_GRACE_S = 5
# sizeLimit of each emptyDir of a job's pods: Ray's session dir and spill files (tmp), the libraries' caches with
# the hub's downloads (cache), a role's checkpoints without a claim, the driver's --out without one (out).
SCRATCH = {"tmp": "16Gi", "cache": "32Gi", "checkpoints": "64Gi", "out": "1Gi"}
LOGS = "1Gi"  # a container's own ephemeral storage beside its emptyDirs: its logs (the root is read-only)
DRIVER_BACKOFF_LIMIT = 2
GCS_WAIT_S = 1800  # the driver's init container gives up on the Ray head after this long
# every kuberl process in a job's pods writes its diagnostics as JSON lines, which log collectors parse (kuberl.logs)
LOG_ENV = [{"name": logs.FORMAT_ENV, "value": "json"}]
RAY_UID = 1000  # the `ray` user of rayproject images
RAY_GID = 100
CACHE_ENV = {"XDG_CACHE_HOME": "", "HF_HOME": "huggingface", "TRITON_CACHE_DIR": "triton", "MPLCONFIGDIR": "matplotlib",
             "TORCHINDUCTOR_CACHE_DIR": "torchinductor"}
DRA_API_VERSION = "resource.k8s.io/v1"  # GA (and served by default) since Kubernetes 1.34
# Standard DRA device attributes (kubernetes.io/docs/reference/node/dra-standard-device-attributes):
# devices sharing a PCIe root complex, or a NUMA node. A matchAttribute constraint only picks devices
# that publish the attribute, with one value across the whole request.
DRA_ATTRIBUTES = {"pcieRoot": "resource.kubernetes.io/pcieRoot", "numaNode": "resource.kubernetes.io/numaNode"}


@dataclass(frozen=True)
class BuildOptions:
    """What the manifests need beyond the spec."""

    namespace: str
    image: str = DEFAULT_IMAGE
    pull_policy: str = "IfNotPresent"
    head: Mapping[str, str] = field(default_factory=lambda: dict(HEAD_RESOURCES))  # the head pod's cpu, memory
    driver: Mapping[str, str] = field(default_factory=lambda: dict(DRIVER_RESOURCES))  # the driver pod's
    cpu_limits: bool = True  # False: CPU requests only (Burstable pods that may use a node's idle cores)
    scratch: Mapping[str, str] = field(default_factory=lambda: dict(SCRATCH))  # emptyDir sizeLimits (SCRATCH)
    network_policy: bool = True  # each job gets a NetworkPolicy (`network`)
    scrapers: Scrapers = Scrapers()  # who may reach the pods' metrics ports (Prometheus)
    gang_scheduling: bool = True  # every pod made gated, let through when the job's whole set fits (gang.py)


def gates(opts: BuildOptions) -> dict[str, Any]:
    """A pod spec's scheduling gate under gang scheduling: the scheduler leaves the pod until the operator lifts it."""
    return {"schedulingGates": [{"name": names.GANG_GATE}]} if opts.gang_scheduling else {}


def image_of(job: RLTrainingJob, opts: BuildOptions) -> str:
    """The job's own runtime image (spec.image), else the operator's default."""
    return job.spec.image or opts.image


def meta(name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": dict(labels)}


def pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": RAY_UID, "runAsGroup": RAY_GID, "fsGroup": RAY_GID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def container_security() -> dict[str, Any]:
    """Every container: no privilege escalation, no capabilities, a read-only root filesystem (what a
    process writes goes to the emptyDirs of ``scratch``, or to the checkpoint and output volumes)."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}


def empty_dir(name: str, size: str, medium: str | None = None) -> dict[str, Any]:
    """An emptyDir volume that the kubelet evicts its pod for past ``size`` (a quantity)."""
    return {"name": name, "emptyDir": {**({"medium": medium} if medium else {}), "sizeLimit": size}}


def with_storage(resources: Mapping[str, Any], volumes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``resources`` (requests, limits, ...) of a pod's one main container with its ephemeral storage: LOGS
    requested; as limit, LOGS plus the sizeLimits of the pod's disk emptyDirs (the kubelet holds a pod to the sum
    of its containers' limits, emptyDirs included; a memory-backed one counts against memory instead)."""
    disk = sum(parse_quantity(v["emptyDir"]["sizeLimit"]) for v in volumes
               if "emptyDir" in v and v["emptyDir"].get("medium") != "Memory")
    limit = format_quantity(disk + parse_quantity(LOGS))
    return {**resources, "requests": {**resources.get("requests", {}), "ephemeral-storage": LOGS},
            "limits": {**resources.get("limits", {}), "ephemeral-storage": limit}}


def init_resources() -> dict[str, Any]:
    """An init container's: it writes nothing but its log (a fixed command, no user code)."""
    return {"requests": {"ephemeral-storage": LOGS}, "limits": {"ephemeral-storage": LOGS}}


def scratch(opts: BuildOptions) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts, env) for what Ray and the runtime write beside a read-only root: /tmp (Ray's
    session dir /tmp/ray, its logs and spill files; Python's tempfiles) and a cache dir that the libraries'
    cache variables point at (torch, triton, Hugging Face). Both emptyDirs, sized by ``opts.scratch``: they go
    with the pod."""
    volumes = [empty_dir(names.TMP_VOLUME, opts.scratch["tmp"]), empty_dir(names.CACHE_VOLUME, opts.scratch["cache"])]
    mounts = [{"name": names.TMP_VOLUME, "mountPath": "/tmp"},
              {"name": names.CACHE_VOLUME, "mountPath": names.CACHE_DIR}]
    env = [{"name": var, "value": f"{names.CACHE_DIR}/{sub}".rstrip("/")} for var, sub in CACHE_ENV.items()]
    return volumes, mounts, env


def ray_auth(job: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts, env) of Ray 2.52+ token authentication: every Ray process and the driver
    share one token, which they read from the job's Secret mounted as a read-only file (never an
    environment variable, which a process's children, crash reports and `ps e` would show)."""
    volume = {"name": names.AUTH_VOLUME, "secret": {"secretName": names.auth_secret(job), "defaultMode": 0o444,
                                                   "items": [{"key": names.AUTH_TOKEN_KEY, "path": "token"}]}}
    mount = {"name": names.AUTH_VOLUME, "mountPath": names.AUTH_DIR, "readOnly": True}
    env = [{"name": "RAY_AUTH_MODE", "value": "token"},
           {"name": "RAY_AUTH_TOKEN_PATH", "value": f"{names.AUTH_DIR}/token"}]
    return [volume], [mount], env


def pod_files(job: str, opts: BuildOptions) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts, env) that every pod of a job has: the scratch dirs and the Ray token's file, and
    JSON log lines (`LOG_ENV`)."""
    (volumes, mounts, env), (auth_volumes, auth_mounts, auth_env) = scratch(opts), ray_auth(job)
    return [*volumes, *auth_volumes], [*mounts, *auth_mounts], [*auth_env, *env, *LOG_ENV]


def uses_dra(job: RLTrainingJob, role: str) -> bool:
    """Whether a role's GPUs come from a ResourceClaimTemplate (spec.placement.mode dra)."""
    return job.spec.placement.mode == "dra" and job.spec.roles.get(role).gpus > 0


def hosts(spec: JobSpec) -> list[str]:
    """The running roles with pods of their own, one worker group each: every one but those colocated with
    another (``spec.roles.<role>.colocateWith``: their ranks run in their host's pods)."""
    return [role for role in enabled_roles(spec) if host_of(spec, role) == role]


def group_roles(spec: JobSpec, host: str) -> tuple[str, ...]:
    """The roles whose processes run in ``host``'s pods: the host, then the roles colocated with it."""
    return sharing(spec, host) or (host,)


def pod_cpu_memory(spec: JobSpec, host: str) -> tuple[str, str]:
    """(cpu, memory) of one pod of ``host``'s worker group: the host's resources as written, or with
    colocated roles, the sum of every role's per-replica resources (each role's processes run there)."""
    roles: list[RoleSpec] = [spec.roles.get(role) for role in group_roles(spec, host)]
    if len(roles) == 1:
        return roles[0].resources.cpu, roles[0].resources.memory
    return (format_quantity(sum(parse_quantity(r.resources.cpu) for r in roles)),
            format_quantity(sum(parse_quantity(r.resources.memory) for r in roles)))


def requests_limits(requests: Mapping[str, Any], cpu_limit: bool = True) -> dict[str, Any]:
    """Limits equal to the requests (Guaranteed QoS: a training pod is not the first one evicted), or, with
    ``cpu_limit`` off (`kuberl operator --no-cpu-limits`), every limit but the CPU's (Burstable)."""
    limits = {k: v for k, v in requests.items() if cpu_limit or k != "cpu"}
    return {"requests": dict(requests), "limits": limits}


def quantities(spec: JobSpec, host: str, device_plugin: bool = True, cpu_limit: bool = True) -> dict[str, Any]:
    """Requests and limits of one pod of ``host``'s worker group (:func:`requests_limits`). GPUs are
    the host's, once per pod (colocated roles share them), as a device-plugin limit, or, under DRA, a
    claim on the pod's ResourceClaim instead."""
    cpu, memory = pod_cpu_memory(spec, host)
    gpus = spec.roles.get(host).gpus
    requests: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpus and device_plugin:
        requests["nvidia.com/gpu"] = gpus
    out = requests_limits(requests, cpu_limit)
    if gpus and not device_plugin:
        out["claims"] = [{"name": names.GPU_CLAIM}]
    return out


def ray_resources_param(spec: JobSpec, host: str) -> str:
    """rayStartParams.resources, per pod, one unit per GPU (or one on CPU) of

    - the resource of each role the pod carries, the host's and its colocated roles': the custom
      resources of the runtime's placement-group bundle for one rank of them all
      (``kuberl.spec.colocation.set_bundle``), so each role's actors, asking one unit of their own role's
      resource, land only on this group's pods, and Ray still tells the roles apart;
    - the pod's topology domain, its Kubernetes node: ``kuberl_node_$(KUBERL_NODE_NAME)``. The node
      is unknown until the pod is scheduled; the kubelet expands ``$(VAR)`` in the container's args
      (where KubeRay writes the `ray start` line) from the env var the downward API fills in.

    Single-quoted: KubeRay pastes the value into a shell command line (and trims the quotes when
    it parses the JSON itself)."""
    units = max(spec.roles.get(host).gpus, 1)
    roles = {key: int(units * amount) for key, amount in set_bundle(spec, host).items() if key not in ("CPU", "GPU")}
    resources = {**roles, node_resource(f"$({names.NODE_NAME_ENV})"): units}
    return "'" + json.dumps(resources, separators=(",", ":")) + "'"


def topology_env() -> list[dict[str, Any]]:
    """The pod's node, from the downward API: the value of its ``kuberl_node_*`` Ray resource."""
    return [{"name": names.NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]


def checkpoint_path(job: RLTrainingJob) -> str:
    """The checkpoint directory inside the pods: the spec's path, or /checkpoints."""
    return job.spec.trainer.checkpoint.path or names.DEFAULT_CHECKPOINT_PATH


def driver_out(job: RLTrainingJob) -> str:
    """The driver's --out, where it writes metrics.jsonl and reward_curve.png. With a checkpoint PVC, on it, per
    job (<checkpoint path>/runs/<job>), so they outlive the pod and a restarted driver continues metrics.jsonl;
    without one, /kuberl/out, an emptyDir of the driver pod that goes with it."""
    if job.spec.trainer.checkpoint.volume_claim:
        return f"{checkpoint_path(job).rstrip('/')}/runs/{job.metadata.name}"
    return names.OUT_DIR


def checkpoint_storage(job: RLTrainingJob, opts: BuildOptions) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                         list[dict[str, Any]]]:
    """(volumes, volumeMounts, initContainers) at the checkpoint path in the driver and every worker: the workers
    write the actor's and critic's (DCP) shards, the driver the step state.

    With spec.trainer.checkpoint.volumeClaim it is that PVC, shared by the job's pods, each mounting only the
    job's folder on it (`names.claim_folder`, a subPath): another job on the same PVC, and its user code,
    never sees this job's checkpoints, nor this job theirs. An init container (the job's image, a fixed
    command, no user code) makes the folder first as the pods' user: one the kubelet made would be root's.
    Without a claim, an emptyDir per pod, so writes succeed but a recreated pod sees none of them (the runtime
    then restores that role from the model path, and a restarted driver starts over)."""
    claim = job.spec.trainer.checkpoint.volume_claim
    if not claim:
        return ([empty_dir(names.CHECKPOINT_VOLUME, opts.scratch["checkpoints"])],
                [{"name": names.CHECKPOINT_VOLUME, "mountPath": checkpoint_path(job)}], [])
    folder = f"{names.CLAIM_MOUNT}/{names.claim_folder(job.metadata.name)}"
    init = {
        "name": "checkpoint-folder",
        "image": image_of(job, opts),
        "imagePullPolicy": opts.pull_policy,
        "command": ["python", "-c", f"import os; os.makedirs({folder!r}, exist_ok=True)"],
        "resources": init_resources(),
        "volumeMounts": [{"name": names.CHECKPOINT_VOLUME, "mountPath": names.CLAIM_MOUNT}],
        "securityContext": container_security(),
    }
    return ([{"name": names.CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim}}],
            [{"name": names.CHECKPOINT_VOLUME, "mountPath": checkpoint_path(job),
              "subPath": names.claim_folder(job.metadata.name)}], [init])


def gpu_claim_template(job: RLTrainingJob, role: str, opts: BuildOptions) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceClaimTemplate: each replica (pod) of the role gets a claim for
    its ``gpus`` devices of ``placement.deviceClass``, all sharing one PCIe root (or NUMA node).

    One GPU needs no constraint, and gets none: matchAttribute would also exclude GPUs whose driver
    does not publish the attribute."""
    spec: RoleSpec = job.spec.roles.get(role)
    placement = job.spec.placement
    name = job.metadata.name
    labels = names.labels(name, "gpu-claim", role)
    request = {"deviceClassName": placement.device_class, "allocationMode": "ExactCount", "count": spec.gpus}
    devices: dict[str, Any] = {"requests": [{"name": names.GPU_CLAIM, "exactly": request}]}
    if spec.gpus > 1:
        devices["constraints"] = [{"requests": [names.GPU_CLAIM],
                                   "matchAttribute": DRA_ATTRIBUTES[placement.dra_constraint]}]
    return {
        "apiVersion": DRA_API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": meta(names.claim_template(name, role), opts.namespace, labels),
        "spec": {"metadata": {"labels": dict(labels)}, "spec": {"devices": devices}},
    }


def gpu_claim_templates(job: RLTrainingJob, opts: BuildOptions) -> list[dict[str, Any]]:
    """One ResourceClaimTemplate per GPU worker group (a colocated role has none: it uses its host's pods'
    GPUs) under spec.placement.mode dra; none otherwise."""
    return [gpu_claim_template(job, role, opts) for role in hosts(job.spec) if uses_dra(job, role)]


def group_size(job: RLTrainingJob, role: str) -> int:
    """A role's pods: its replicas, and with a warm standby (`JobSpec.standby`) one more, Running, for it."""
    return job.spec.roles.get(role).replicas + int(job.spec.standby(role))


def worker_group(job: RLTrainingJob, role: str, opts: BuildOptions) -> dict[str, Any]:
    """One KubeRay worker group per host role: groupName = role, a fixed size, the Ray resources of the
    role and of the roles colocated with it, their CPU and memory, the host's GPUs."""
    spec: RoleSpec = job.spec.roles.get(role)
    name = job.metadata.name
    dra = uses_dra(job, role)
    (volumes, mounts, init), (tmp_volumes, tmp_mounts, tmp_env) = checkpoint_storage(job, opts), pod_files(
        name, opts)
    volumes, mounts = [*tmp_volumes, *volumes], [*tmp_mounts, *mounts]
    if spec.gpus:  # host memory for the actor's and critic's per-step snapshots (and NCCL), charged to the pod
        volumes.append(empty_dir(names.SHM_VOLUME, pod_cpu_memory(job.spec, role)[1], medium="Memory"))
        mounts.append({"name": names.SHM_VOLUME, "mountPath": "/dev/shm"})
    container: dict[str, Any] = {
        "name": "ray-worker",
        "image": image_of(job, opts),
        "imagePullPolicy": opts.pull_policy,
        "resources": with_storage(quantities(job.spec, role, device_plugin=not dra, cpu_limit=opts.cpu_limits),
                                  volumes),
        "env": [*topology_env(), *tmp_env, *job.spec.credentials.env(driver=False)],
        "securityContext": container_security(),
    }
    if mounts:
        container["volumeMounts"] = mounts
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # a dead worker stays dead; the operator restarts the role as a gang
        "automountServiceAccountToken": False,  # user reward code runs here: no API credentials
        "securityContext": pod_security(),
        "terminationGracePeriodSeconds": WORKER_GRACE_S,
        "containers": [container],
    }
    if init:
        pod_spec["initContainers"] = init
    if volumes:
        pod_spec["volumes"] = volumes
    if dra:  # each pod gets its own ResourceClaim made from the role's template
        pod_spec["resourceClaims"] = [{"name": names.GPU_CLAIM,
                                       "resourceClaimTemplateName": names.claim_template(name, role)}]
    pod_spec.update(pod_scheduling(spec))
    pod_spec.update(gates(opts))
    pods = group_size(job, role)
    topology = {"annotations": spec.kueue_topology.annotations()} if spec.kueue_topology else {}
    return {
        "groupName": role,
        "replicas": pods,
        "minReplicas": pods,
        "maxReplicas": pods,
        "rayStartParams": {"resources": ray_resources_param(job.spec, role), "num-gpus": str(spec.gpus)},
        "template": {"metadata": {"labels": names.labels(name, "worker", role), **topology}, "spec": pod_spec},
    }


def head_group(job: RLTrainingJob, opts: BuildOptions) -> dict[str, Any]:
    """The head runs the GCS and the dashboard and no work (num-cpus 0)."""
    name = job.metadata.name
    volumes, mounts, env = pod_files(name, opts)
    return {
        "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0"},
        "template": {
            "metadata": {"labels": names.labels(name, "head")},
            "spec": {
                "automountServiceAccountToken": False,
                "securityContext": pod_security(),
                **gates(opts),
                "volumes": volumes,
                "containers": [{
                    "name": "ray-head",
                    "image": image_of(job, opts),
                    "imagePullPolicy": opts.pull_policy,
                    "resources": with_storage(requests_limits(opts.head, opts.cpu_limits), volumes),
                    "ports": [{"name": "gcs", "containerPort": names.GCS_PORT},
                              {"name": "dashboard", "containerPort": 8265},
                              {"name": "client", "containerPort": 10001}],
                    "env": env,
                    "volumeMounts": mounts,
                    "securityContext": container_security(),
                }],
            },
        },
    }


def ray_cluster(job: RLTrainingJob, opts: BuildOptions) -> dict[str, Any]:
    """A ray.io/v1 RayCluster: the head plus one worker group per enabled role that is not colocated
    with another (a colocated role's ranks run in its host's group). A job labelled for a Kueue queue passes the
    label (and Kueue's priority class) on, and its RayCluster starts suspended."""
    name = job.metadata.name
    kueue = {k: v for k, v in (job.metadata.labels or {}).items() if k in names.KUEUE_LABELS}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {**meta(names.cluster(name), opts.namespace, {**names.labels(name, "ray-cluster"), **kueue}),
                     "annotations": applied_annotation(job)},
        "spec": {
            # a queued job's RayCluster is made suspended: Kueue admits it as one workload (the head and a pod set
            # per worker group) and unsuspends it; it suspends it again to preempt it
            **({"suspend": True} if names.QUEUE_LABEL in kueue else {}),
            "headGroupSpec": head_group(job, opts),
            "workerGroupSpecs": [worker_group(job, role, opts) for role in hosts(job.spec)],
        },
    }


def join_ray(head: str, attempts: int = 3) -> str:
    """The driver container's shell line: join the Ray cluster as a node that runs nothing (a Ray driver needs
    a raylet of its own on its machine: without one ``ray.init`` finds "no node info"), then become the
    container's args (`kuberl run`), so its exit code is the container's. `ray start` gives its raylet 30 s to
    register, too little while a whole Ray cluster starts again on a busy node (after its head's loss), so a failed
    join is tried `attempts` times; the last failure exits ``NO_CAPACITY`` (retried), with `ray start`'s output."""
    log = "/tmp/ray-start.log"
    start = f"ray start --address={head} --num-cpus=0 --num-gpus=0 --disable-usage-stats > {log} 2>&1"
    return (f"for attempt in $(seq {attempts}); do {start} && break; ray stop --force > /dev/null 2>&1; "
            f"[ $attempt = {attempts} ] && {{ cat {log}; exit {ExitCode.NO_CAPACITY.value}; }}; sleep 5; done; "
            f"exec \"$@\"")


def api_token_volume() -> dict[str, Any]:
    """What the kubelet's automount would give, as a volume that only the reporter mounts: a rotated
    ServiceAccount token, the cluster's CA and the namespace."""
    return {"name": names.API_TOKEN_VOLUME, "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
    ]}}


def reporter(job: RLTrainingJob, opts: BuildOptions) -> dict[str, Any]:
    """The driver pod's reporter, a native sidecar (an init container that keeps running, stopped after the
    driver): it alone holds the API token, and relays the driver's reports to ConfigMap <job>-progress and the
    operator's replicas back (kuberl.metrics.reporter), so that no user code in the driver can reach the API."""
    return {
        "name": "reporter",
        "image": image_of(job, opts),
        "imagePullPolicy": opts.pull_policy,
        "restartPolicy": "Always",
        "command": ["kuberl", "report-progress", "--dir", names.PROGRESS_MOUNT],
        "env": [{"name": Env.PROGRESS_CONFIGMAP, "value": names.progress_configmap(job.metadata.name)},
                {"name": Env.NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}, *LOG_ENV],
        "resources": with_storage(requests_limits(REPORTER_RESOURCES, opts.cpu_limits), []),
        "volumeMounts": [{"name": names.PROGRESS_VOLUME, "mountPath": names.PROGRESS_MOUNT},
                         {"name": names.API_TOKEN_VOLUME, "mountPath": names.SA_DIR, "readOnly": True}],
        "securityContext": container_security(),
    }


def driver_job(job: RLTrainingJob, opts: BuildOptions) -> dict[str, Any]:
    """The driver (single controller) as a batch/v1 Job, like KubeRay's RayJob submitter. It runs with
    ``--no-export``: exporting loads the whole policy into the driver's process, which a driver sized for
    control (DRIVER_RESOURCES) cannot hold for a real model; `kuberl export` does it from the checkpoints."""
    name = job.metadata.name
    head = f"{names.head_service(name)}:{names.GCS_PORT}"
    wait_for_gcs = (
        "import socket, sys, time\n"
        f"deadline = time.time() + {GCS_WAIT_S}\n"
        "while True:\n"
        "    try:\n"
        f"        socket.create_connection(({names.head_service(name)!r}, {names.GCS_PORT}), 2).close(); break\n"
        "    except OSError:\n"
        "        if time.time() > deadline:\n"
        f"            sys.exit('the Ray head did not answer within {GCS_WAIT_S}s')\n"
        "        time.sleep(2)\n"
    )
    env = [{"name": Env.PROGRESS_DIR, "value": names.PROGRESS_MOUNT}]
    image = image_of(job, opts)
    (volumes, mounts, init), (tmp_volumes, tmp_mounts, tmp_env) = checkpoint_storage(job, opts), pod_files(
        name, opts)
    volumes = [*tmp_volumes, *volumes, empty_dir(names.PROGRESS_VOLUME, PROGRESS_SIZE)]
    mounts = [*tmp_mounts, *mounts, {"name": names.PROGRESS_VOLUME, "mountPath": names.PROGRESS_MOUNT}]
    env = [*env, *tmp_env, *job.spec.credentials.env(driver=True)]
    out = driver_out(job)
    if out == names.OUT_DIR:
        volumes = [empty_dir("out", opts.scratch["out"]), *volumes]
        mounts = [{"name": "out", "mountPath": out}, *mounts]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(names.driver(name), opts.namespace, names.labels(name, "driver")),
        "spec": {
            "backoffLimit": DRIVER_BACKOFF_LIMIT,
            "podFailurePolicy": {"rules": [
                # `kuberl run` exits 1 for bad input and 3 when the job cannot go on (a spent budget,
                # degraded placement, a role's code raising): retrying cannot help. Exit 4 (no capacity
                # in time) and crashes are retried. An evicted or preempted driver does not use up a retry.
                {"action": "FailJob", "onExitCodes": {"containerName": "driver", "operator": "In",
                                                       "values": [ExitCode.BAD_INPUT.value,
                                                                  ExitCode.GAVE_UP.value]}},
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                # A driver whose Ray node or cluster is gone (the head restarted, Ray declared its node dead after a
                # cut) exits 6: the cluster's loss, not the driver's, retried as an eviction is. A long job would
                # otherwise spend its retries on such losses over its life.
                {"action": "Ignore", "onExitCodes": {"containerName": "driver", "operator": "In",
                                                      "values": [ExitCode.RAY_LOST.value]}},
            ]},
            "template": {
                "metadata": {"labels": names.labels(name, "driver")},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": names.driver(name),  # its token: in the reporter sidecar only
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": REPORTER_GRACE_S,
                    "securityContext": pod_security(),
                    **gates(opts),
                    "initContainers": [*init, {
                        "name": "wait-for-ray",
                        "image": image,
                        "imagePullPolicy": opts.pull_policy,
                        "command": ["python", "-c", wait_for_gcs],
                        "resources": init_resources(),
                        "securityContext": container_security(),
                    }, reporter(job, opts)],
                    "containers": [{
                        "name": "driver",
                        "image": image,
                        "imagePullPolicy": opts.pull_policy,
                        "command": ["sh", "-c", join_ray(head), "join-ray"],
                        "args": ["kuberl", "run", f"{names.SPEC_MOUNT}/{names.SPEC_FILE}",
                                 "--ray-address", head, "--out", out, "--no-progress", "--no-export",
                                 "--metrics-port", str(names.DRIVER_METRICS_PORT), "--metrics-address", "0.0.0.0"],
                        "ports": [{"name": "metrics", "containerPort": names.DRIVER_METRICS_PORT}],
                        "env": env,
                        "resources": with_storage(requests_limits(opts.driver, opts.cpu_limits), volumes),
                        "volumeMounts": [{"name": "spec", "mountPath": names.SPEC_MOUNT, "readOnly": True}, *mounts],
                        "securityContext": container_security(),
                    }],
                    "volumes": [{"name": "spec", "configMap": {"name": names.spec_configmap(name)}}, *volumes,
                                api_token_volume()],
                },
            },
        },
    }


def spec_configmap(job: RLTrainingJob, raw_spec: Mapping[str, Any], opts: BuildOptions) -> dict[str, Any]:
    """The job's manifest as the driver reads it: `kuberl run /etc/kuberl/job.yaml`. Without a path,
    the path becomes the checkpoint volume's mount point (/checkpoints)."""
    name = job.metadata.name
    spec = copy.deepcopy(dict(raw_spec))
    path = checkpoint_path(job)
    if job.spec.trainer.checkpoint.path is None:
        trainer = spec.setdefault("trainer", {})
        trainer["checkpoint"] = {**(trainer.get("checkpoint") or {}), "path": path}
    manifest = {"apiVersion": API_VERSION, "kind": KIND,
                "metadata": {"name": name, "namespace": opts.namespace}, "spec": spec}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(names.spec_configmap(name), opts.namespace, names.labels(name, "spec")),
        "data": {names.SPEC_FILE: yaml.safe_dump(manifest, sort_keys=False)},
    }


def replicas_document(job: RLTrainingJob) -> ReplicasDocument:
    """What the operator asks the driver to run: the spec's replicas of each live-resized role the job runs."""
    return ReplicasDocument(roles={r: job.spec.roles.get(r).replicas for r in resized_live(job.spec)})


def progress_configmap(job: RLTrainingJob, opts: BuildOptions) -> dict[str, Any]:
    """Where the driver reports progress (data.progress, JSON), which the operator mirrors to status, and
    reads the replicas the operator asks for (data.replicas, JSON: `resize`)."""
    name = job.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(names.progress_configmap(name), opts.namespace, names.labels(name, "progress")),
        "data": {PROGRESS_KEY: "{}", REPLICAS_KEY: replicas_document(job).to_json()},
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
    """The Ray auth token shared by the head, the workers and the driver: the operator makes the token when it
    creates the Secret (``ray_token``), and never reads it back."""
    name = job.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta(names.auth_secret(name), opts.namespace, names.labels(name, "ray-auth")),
        "type": "Opaque",
        "immutable": True,  # Ray reads its token once per process: a changed one would lock later pods out
        "stringData": {names.AUTH_TOKEN_KEY: token},
    }


def runtime_objects(job: RLTrainingJob, opts: BuildOptions) -> list[dict[str, Any]]:
    """What suspend removes and resume recreates: the GPU claim templates (immutable, so a resumed
    job gets ones that match its current spec), the RayCluster and the driver Job."""
    return [*gpu_claim_templates(job, opts), ray_cluster(job, opts), driver_job(job, opts)]


def all_objects(job: RLTrainingJob, raw_spec: Mapping[str, Any], token: str | None,
                opts: BuildOptions) -> list[dict[str, Any]]:
    """Every object of a running job, in creation order (its NetworkPolicy before any of its pods); without a token
    (what `kuberl render` prints) no Secret: the operator makes it, with a token of its own."""
    return [
        *driver_rbac(job, opts),
        *([network_policy(job, opts.namespace, opts.scrapers)] if opts.network_policy else []),
        *([auth_secret(job, token, opts)] if token is not None else []),
        spec_configmap(job, raw_spec, opts),
        progress_configmap(job, opts),
        *runtime_objects(job, opts),
    ]

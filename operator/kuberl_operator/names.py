"""Names, labels and keys shared by the builders, the health checks and the handlers.

Every child object's name derives from the job's name, so the operator finds what exists by name
and never creates a second copy (a create that races another answers 409 and is adopted).
The job name is at most 53 characters (spec model), so ``<job>-head-svc`` fits a Service's 63.
"""

from __future__ import annotations

from kuberl.spec import GROUP, PLURAL, VERSION
from kuberl.spec.contract import Env

PREFIX = GROUP  # kopf's progress/diff-base annotations and our finalizer live under kuberl.io
FINALIZER = f"{GROUP}/finalizer"
LABEL_JOB = f"{GROUP}/job"
LABEL_ROLE = f"{GROUP}/role"
LABEL_COMPONENT = "app.kubernetes.io/component"
COMMON_LABELS = {"app.kubernetes.io/name": "kuberl", "app.kubernetes.io/managed-by": "kuberl-operator"}
JOB_RESOURCE = (GROUP, VERSION, PLURAL)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # a job Kueue admits: its RayCluster carries it (one workload)
KUEUE_LABELS = (QUEUE_LABEL, "kueue.x-k8s.io/priority-class")  # copied from the job to its RayCluster
GANG_GATE = f"{GROUP}/gang"  # every pod's scheduling gate until its job's whole set fits (gang.py)

SPEC_MOUNT = "/etc/kuberl"
SPEC_FILE = "job.yaml"
OUT_DIR = "/kuberl/out"
GCS_PORT = 6379
DRIVER_METRICS_PORT = 9500  # the driver serves /metrics here on the pod IP (the chart's PodMonitor scrapes it)
AUTH_TOKEN_KEY = "auth_token"
AUTH_VOLUME, AUTH_DIR = "ray-auth", "/var/run/kuberl/ray-auth"  # the token's file in every pod of a job
GPU_CLAIM = "gpus"  # the pod's resourceClaims entry (and the template's device request) under DRA
NODE_NAME_ENV = Env.NODE_NAME  # a worker's Kubernetes node, from the downward API
CHECKPOINT_VOLUME = "checkpoints"
TMP_VOLUME, CACHE_VOLUME = "tmp", "cache"  # emptyDirs beside the read-only root filesystem
SHM_VOLUME = "shm"  # a GPU worker's /dev/shm in memory: per-step snapshots, NCCL (a pod's own is 64 MiB)
CACHE_DIR = "/kuberl/cache"
DEFAULT_CHECKPOINT_PATH = "/checkpoints"  # where a checkpoint PVC is mounted unless the spec names a path
CLAIM_MOUNT = "/kuberl/claim"  # the whole checkpoint PVC, in the init container that makes the job's folder
PROGRESS_VOLUME, PROGRESS_MOUNT = "progress", "/run/kuberl/progress"  # the driver's reports, its reporter's replicas
API_TOKEN_VOLUME = "api-token"  # the ServiceAccount token: in the driver pod's reporter sidecar only
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where a client looks for it (kuberl.metrics.progress.SA_DIR)


def labels(job: str, component: str, role: str | None = None) -> dict[str, str]:
    """Labels of every object and pod of a job; worker pods also carry their role."""
    out = {**COMMON_LABELS, LABEL_JOB: job, "app.kubernetes.io/instance": job, LABEL_COMPONENT: component}
    if role is not None:
        out[LABEL_ROLE] = role
    return out


def cluster(job: str) -> str:
    return job


def head_service(job: str) -> str:
    """The Service KubeRay creates for the head pod."""
    return f"{cluster(job)}-head-svc"


def driver(job: str) -> str:
    """The driver Job, its ServiceAccount, Role and RoleBinding."""
    return f"{job}-driver"


def spec_configmap(job: str) -> str:
    return f"{job}-spec"


def progress_configmap(job: str) -> str:
    return f"{job}-progress"


def claim_folder(job: str) -> str:
    """The job's folder on its checkpoint PVC (the subPath every pod mounts): no job sees another's."""
    return f"kuberl/{job}"


def auth_secret(job: str) -> str:
    return f"{job}-ray-auth"


def network_policy(job: str) -> str:
    return f"{job}-network"


def claim_template(job: str, role: str) -> str:
    """The ResourceClaimTemplate of a role's GPUs (spec.placement.mode dra)."""
    return f"{job}-{role}-gpus"

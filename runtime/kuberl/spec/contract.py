"""What the runtime and the operator both read, defined once: exit codes, reason codes, environment
names, the progress document and the restart-budget rule. Pure pydantic: the operator imports it.

The driver (``kuberl run``) writes the progress document into ConfigMap ``<job>-progress`` as
``data.progress``; the operator parses it with `ProgressDocument.parse` and mirrors it into the
RLTrainingJob status. The driver's exit code tells the driver Job's pod failure policy whether a
retry can help.
"""

from __future__ import annotations

import enum
import json
import re
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ExitCode(enum.IntEnum):
    """`kuberl run`'s exit codes (the driver Job fails for good on BAD_INPUT and GAVE_UP)."""

    OK = 0
    BAD_INPUT = 1  # the manifest, the data, an import path: retrying cannot help
    GAVE_UP = 3  # a role spent its restart budget, placement is degraded, a role's code raised
    NO_CAPACITY = 4  # a role could not start in time (no capacity): worth a retry
    CRASHED = 5  # an error nothing expected (a bug): traceback on stderr; retried, counted by backoffLimit
    RAY_LOST = 6  # the driver's Ray node or cluster is gone (Ray declared its node dead, the head restarted): retried,
    # not counted (`kuberl.resilience.ownlink`), as an evicted driver is not
    INTERRUPTED = 130


class Reason(str, enum.Enum):
    """CamelCase reason codes (Kubernetes condition reasons) that cross the runtime/operator line.

    Free text goes in a ``message`` or ``detail`` beside the code, never in the code.
    """

    REACHED_MAX_RESTARTS = "ReachedMaxRestarts"  # a role failed more often than its maxRestarts allows
    PLACEMENT_DEGRADED = "PlacementDegraded"  # GPUs linked below spec.placement.minLink under `required`
    ROLE_ERROR = "RoleError"  # a role's code raised (deterministic: no restart)
    WORKER_FAILURE = "WorkerFailure"  # a role could not (re)start: no capacity in time, or it died starting
    WORKER_DIED = "WorkerDied"  # a rank's process died (a recovery's cause)
    WORKER_HUNG = "WorkerHung"  # a rank stopped answering within spec.resilience.callTimeoutSeconds
    WORKER_UNREACHABLE = "WorkerUnreachable"  # a rank cut off: it and its node silent, or a call's link broken
    CHECKPOINT_REFUSED = "CheckpointRefused"  # a checkpoint to load is not the job's own, or holds code

    def __str__(self) -> str:
        return self.value


REASON_PATTERN = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")  # what Kubernetes accepts as a reason


class Env:
    """Environment variables set by the operator (or a user) and read by the runtime."""

    PROGRESS_CONFIGMAP = "KUBERL_PROGRESS_CONFIGMAP"  # the driver's progress ConfigMap; unset: no reports
    NAMESPACE = "KUBERL_NAMESPACE"  # the job's namespace (downward API)
    API_URL = "KUBERL_API_URL"  # the API server, when not the in-cluster service
    SA_DIR = "KUBERL_SA_DIR"  # where the service-account token and ca.crt are (the reporter outside its pod)
    PROGRESS_DIR = "KUBERL_PROGRESS_DIR"  # the folder the driver and its reporter share (PROGRESS_FILE, REPLICAS_FILE)
    NODE_NAME = "KUBERL_NODE_NAME"  # a worker pod's Kubernetes node (downward API): its topology domain
    NODE_IP = "KUBERL_NODE_IP"  # the address a role's rank 0 offers for the torch.distributed rendezvous
    COMPILE = "KUBERL_COMPILE"  # "0": no torch.compile of training kernels on CUDA


def restart_budget_spent(failures: int, max_restarts: int) -> bool:
    """Whether a role that has failed `failures` times (each failure asks for one restart, the newest
    included) has spent `spec.roles.<role>.maxRestarts`: maxRestarts restarts are allowed, so the
    (maxRestarts + 1)-th failure ends the job. maxRestarts 0: the first failure does."""
    return failures > max_restarts


Phase = Literal["Running", "Succeeded", "Failed"]  # what the driver reports in `phase`
PHASES = get_args(Phase)
# Bounds of what the operator accepts from a driver (user code runs there): a document's bytes, its roles, a
# role's hosts, and every count (within int64, and what a JSON reader keeps exact).
DOCUMENT_MAX, ROLES_MAX, HOSTS_MAX, COUNT_MAX, MESSAGE_MAX = 256 * 1024, 32, 1024, 2**53, 1024


class _Doc(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="ignore")


METRICS_MAX = 8  # figures of a step in the progress report
MetricName = Annotated[str, Field(pattern=r"^[a-zA-Z][a-zA-Z0-9]{0,63}$")]
MetricValue = Annotated[float, Field(ge=-1e15, le=1e15, allow_inf_nan=False)]


class RoleProgress(_Doc):
    restarts: int | None = Field(None, ge=0, le=COUNT_MAX, description="Restarts of the role's WorkerGroup the driver "
                                                                       "made.")
    worst_link: str | None = Field(None, alias="worstLink", max_length=16,
                                   description="Worst GPU link inside the role's groups.")
    last_failure: str | None = Field(
        None, alias="lastFailure", max_length=MESSAGE_MAX,
        description="The role's newest failure in one line: reason, step, phase, then a hang's diagnosis (role, rank, "
                    "innermost frame, collective or user code) or what happened; for status.roles.<role>.lastFailure "
                    "and an Event.")
    standby_ready: bool | None = Field(
        None, alias="standbyReady", description="spec.resilience.standby: the role's warm standby can take over now.")
    replicas: int | None = Field(None, ge=0, le=COUNT_MAX, description="Replicas the role's WorkerGroup runs now (a "
                                                                       "live resize shows here once applied).")
    hosts: list[Annotated[str, Field(max_length=253)]] | None = Field(
        None, max_length=HOSTS_MAX, description="Hostnames of the role's ranks (in a cluster: its pods' names), so a "
                                                "shrink removes the pods no rank uses.")


class ProgressDocument(_Doc):
    """``data.progress`` of ConfigMap ``<job>-progress``: every key optional, e.g.::

        {"step": 12, "totalSteps": 60, "tokensPerSec": 5321.5, "phase": "Running", "message": "",
         "reason": "PlacementDegraded", "roles": {"critic": {"restarts": 1, "worstLink": "PIX",
         "lastFailure": "WorkerHung at step 3 (values): role critic rank 1 hung in user code: ...",
         "standbyReady": true}}}
    """

    step: int | None = Field(None, ge=0, le=COUNT_MAX)
    total_steps: int | None = Field(None, alias="totalSteps", ge=0, le=COUNT_MAX)
    tokens_per_sec: float | None = Field(None, alias="tokensPerSec", ge=0, le=1e15, allow_inf_nan=False)
    phase: Phase | None = None
    message: str | None = Field(None, max_length=MESSAGE_MAX)
    reason: str | None = Field(None, pattern=REASON_PATTERN.pattern, max_length=128, description="A Reason code.")
    roles: dict[str, RoleProgress] = Field(default_factory=dict)
    resumed_from: int | None = Field(None, alias="resumedFrom", ge=0, le=COUNT_MAX,
                                     description="The checkpoint step this driver resumed from (absent: it started "
                                                 "at step 0).")
    steps_lost: int | None = Field(None, alias="stepsLost", ge=0, le=COUNT_MAX,
                                   description="Steps the driver before this one completed past that checkpoint: "
                                               "trained again.")
    step_seconds: float | None = Field(None, alias="stepSeconds", ge=0, le=1e9, allow_inf_nan=False,
                                       description="Wall time of the last step (s).")
    metrics: dict[MetricName, MetricValue] | None = Field(
        None, max_length=METRICS_MAX,
        description="The last step's figures by camelCase name: rewardMean, rewardStd, responseLengthMean.")
    refused: tuple[str, ...] = Field((), exclude=True, description="What the reader dropped (field paths), not sent.")

    def restarts_of(self, role: str) -> int:
        entry = self.roles.get(role)
        return entry.restarts or 0 if entry is not None else 0

    def replicas_of(self, role: str) -> int | None:
        entry = self.roles.get(role)
        return entry.replicas if entry is not None else None

    def hosts_of(self, role: str) -> list[str]:
        entry = self.roles.get(role)
        return list(entry.hosts or []) if entry is not None else []

    def failure_of(self, role: str) -> str | None:
        entry = self.roles.get(role)
        return entry.last_failure if entry is not None else None

    def link_of(self, role: str) -> str | None:
        entry = self.roles.get(role)
        return entry.worst_link if entry is not None else None

    def to_json(self) -> str:
        return json.dumps(self.model_dump(by_alias=True, exclude_none=True, mode="json"))

    @classmethod
    def parse(cls, text: str | None) -> ProgressDocument:
        """The reader's side: anything malformed or past its bounds (the whole document past DOCUMENT_MAX bytes,
        one field, a role past ROLES_MAX) is dropped rather than trusted, named in ``refused``; what is
        well-formed is kept. Numbers are finite and within int64, strings and lists capped."""
        if text is not None and len(text) > DOCUMENT_MAX:
            return cls(refused=("progress",))
        try:
            data = json.loads(text or "{}")
        except (ValueError, RecursionError):
            return cls(refused=("progress",))
        if not isinstance(data, dict):
            return cls(refused=("progress",))
        refused: list[str] = []
        fields = _valid_fields(cls, data, refused, skip={"roles", "refused"})
        roles_in = data.get("roles") if isinstance(data.get("roles"), dict) else {}
        if "roles" in data and not isinstance(data.get("roles"), dict):
            refused.append("roles")
        roles = {}
        for role, entry in list(roles_in.items()):
            if len(roles) == ROLES_MAX or not isinstance(entry, dict) or len(role) > 63:
                refused.append(f"roles.{role[:63]}")
                continue
            roles[role] = RoleProgress(**_valid_fields(RoleProgress, entry, refused, prefix=f"roles.{role}."))
        return cls(**fields, roles=roles, refused=tuple(refused))


class ReplicasDocument(_Doc):
    """The replicas the job's spec asks for now, of the roles that are resized while the job runs, e.g.
    ``{"roles": {"ref": 1, "reward": 3}}``. One document, two transports: on Kubernetes the operator writes
    it into ``data.replicas`` of ConfigMap ``<job>-progress`` (which the driver may already get) and the
    driver reads it between two steps; on a local run `kuberl scale` leaves one in the run's folder."""

    roles: dict[str, int] = Field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(by_alias=True, mode="json"), sort_keys=True)

    @classmethod
    def parse(cls, text: str | None) -> ReplicasDocument:
        """The reader's side: a malformed document, or a role whose count is not a whole number, is dropped."""
        try:
            data = json.loads(text or "{}")
        except ValueError:
            return cls()
        roles = data.get("roles") if isinstance(data, dict) and isinstance(data.get("roles"), dict) else {}
        return cls(roles={r: n for r, n in roles.items() if isinstance(n, int) and not isinstance(n, bool)})


# roles the driver resizes between two steps, with no other role restarted: ref and reward reload the model
# path; actor and critic restart at the new world size from the checkpoint of the last completed step; env (its
# environments live one rollout) starts anew and the actor is given its new workers
LIVE_RESIZED = ("actor", "critic", "ref", "reward", "env")
PROGRESS_KEY = "progress"  # ConfigMap <job>-progress: the driver's ProgressDocument (driver -> operator)
REPLICAS_KEY = "replicas"  # ConfigMap <job>-progress: the spec's ReplicasDocument (operator -> driver)
# The same two documents as files in Env.PROGRESS_DIR, between the driver (which holds no API token) and the
# reporter beside it, which alone patches and reads the ConfigMap (kuberl.metrics.reporter)
PROGRESS_FILE, REPLICAS_FILE = "progress.json", "replicas.json"


def _valid_fields(model: type[BaseModel], data: dict[str, Any], refused: list[str], skip: set[str] = frozenset(),
                  prefix: str = "") -> dict[str, Any]:
    """The entries of `data` that are, each on its own, valid fields of `model` (by alias); the others' paths
    are added to `refused`."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        if key not in skip and key in data:
            valid = _valid(model, key, data[key])
            out.update(valid)
            if not valid:
                refused.append(prefix + key)
    return out


def _valid(model: type[BaseModel], key: str, value: Any) -> dict[str, Any]:
    """{key: value} when `value` is a valid `key` of `model` on its own (strict: no "4" for 4, no bools), else {}."""
    try:
        model.model_validate({key: value}, strict=True)
    except ValidationError:
        return {}
    return {key: value}

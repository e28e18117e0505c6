"""The RLTrainingJob's status, as the operator writes it: typed in Python, camelCase on the wire, a field
that is None left out (`to_status`). The CRD's status schema is generated from these models (`crd.status_schema`),
so a field is declared once.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

JobPhase = Literal["Pending", "Provisioning", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]


def _nothing_required(schema: dict[str, Any]) -> None:
    """The API server requires no status field: the operator writes merge patches, and a job refused before
    anything was made has no roles."""
    schema.pop("required", None)


class StatusModel(BaseModel):
    """Base of the status models: camelCase aliases, unknown fields refused (a typo fails in Python, not on the
    API server, which would prune it)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              json_schema_extra=_nothing_required)

    def to_status(self) -> dict[str, Any]:
        """The JSON the operator writes: camelCase keys, None fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True)


class Condition(StatusModel):
    """A Kubernetes-style condition (`kuberl_operator.conditions`)."""

    model_config = ConfigDict(json_schema_extra=None)  # type and status are required, as Kubernetes' conditions

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    observed_generation: int | None = None
    last_transition_time: str | None = Field(None, json_schema_extra={"format": "date-time"})


class HeadStatus(StatusModel):
    """The Ray head pod: its failure restarts the whole Ray cluster (docs/operator.md)."""

    ready: bool
    restarts: int = Field(description="Whole-cluster restarts after the head pod failed.")
    last_failure: str | None = None
    members: dict[str, str] = Field(description="Head pods seen alive, uid -> name.")
    handled_uids: list[str] = Field(alias="handledUIDs", description="Head pods whose failure is already counted.")


class RoleStatus(StatusModel):
    """One role's health, restarts, worst GPU link, and the operator's pod bookkeeping."""

    desired: int = Field(description="The role's pods (replicas, and its standby).")
    colocated_with: str | None = Field(None, description="spec.roles.<role>.colocateWith: the role whose pods run "
                                                         "this role's ranks (desired and ready count those pods).")
    standby: int | None = Field(None, description="Standby pods (a role's warm standby).")
    ready: int
    restarts: int = Field(description="max(podRestarts, the driver's count).")
    pod_restarts: int = Field(description="Restarts the operator counted from pod failures.")
    last_failure: str | None = Field(None, description="The newest failure: a pod's, or the one the driver "
                                                       "reported.")
    driver_failure: str | None = Field(None, description="The newest failure the driver reported (a hang's "
                                                         "diagnosis, a process that died).")
    replicas: int | None = Field(None, description="Replicas the driver's WorkerGroup runs now, as it reported (a "
                                                   "live resize shows here once applied).")
    worst_link: str | None = Field(None, description="Worst GPU link inside the role's groups (NV#, PIX, PXB, PHB, "
                                                     "NODE, SYS).")
    unschedulable: str | None = Field(None, description="Why the role's pods wait for a node, in the scheduler's "
                                                        "words.")
    unschedulable_since: str | None = Field(None, description="When the role began to wait for a node "
                                                              "(startTimeoutSeconds bounds the wait).")
    image_waiting: str | None = Field(None, description="Why a pod of the role cannot start from its image "
                                                        "(ImagePullBackOff, ErrImageNeverPull).")
    members: dict[str, str] = Field(description="Pods seen alive, uid -> name (a member that vanishes was "
                                                "deleted).")
    handled_uids: list[str] = Field(alias="handledUIDs", description="Pods whose failure is already counted.")


class TrainerStatus(StatusModel):
    """How far training is, as Kubeflow Trainer's status.trainerStatus has it, from the driver's last report."""

    progress_percentage: int | None = Field(None, description="step of totalSteps, in percent (rounded down).")
    estimated_remaining_seconds: int | None = Field(
        None, description="(totalSteps - step) x the driver's last step time: a step's checkpoint or a restart "
                          "makes it jump.")
    metrics: dict[str, float] | None = Field(None, description="The last step's metrics as the driver reported "
                                                               "them: rewardMean, rewardStd, responseLengthMean.")
    last_updated_time: str | None = Field(None, json_schema_extra={"format": "date-time"},
                                          description="When the step these figures describe was first seen.")


class JobStatus(StatusModel):
    """`.status` of an RLTrainingJob: written by the operator only."""

    phase: JobPhase
    phase_since: str | None = Field(
        None, json_schema_extra={"format": "date-time"},
        description="When the job entered its phase: Restarting and Provisioning have deadlines "
                    "(spec.resilience.restartTimeoutSeconds, startTimeoutSeconds).")
    step: int | None = Field(None, description="Last training step the driver reported.")
    total_steps: int | None = None
    tokens_per_sec: float | None = None
    resumed_from: int | None = Field(None, description="The checkpoint step the running driver resumed from (after "
                                                       "a head failure or a lost driver pod).")
    steps_lost: int | None = Field(None, description="Steps the driver before it had completed past that "
                                                     "checkpoint, trained again.")
    restarts: int | None = Field(None, description="Restarts summed over roles.")
    ray_cluster: str | None = Field(None, description="Name of the live RayCluster.")
    ray_cluster_uid: str | None = Field(None, alias="rayClusterUID",
                                        description="UID of the live RayCluster: pods of another cluster never count.")
    observed_generation: int
    message: str
    start_time: str | None = Field(
        None, json_schema_extra={"format": "date-time"},
        description="When the job last became active: its start, or its last resume (spec.activeDeadlineSeconds "
                    "counts from here); none while suspended.")
    completion_time: str | None = Field(
        None, json_schema_extra={"format": "date-time"},
        description="When it succeeded or failed (spec.ttlSecondsAfterFinished counts from here).")
    trainer_status: TrainerStatus | None = None
    pending_changes: list[str] | None = Field(
        None, description="Spec fields changed since the running RayCluster and driver were made: applied by a "
                          "suspend and resume.")
    conditions: list[Condition]
    head: HeadStatus | None = None
    roles: dict[str, RoleStatus] | None = Field(
        None, description="Per role: health, restarts, worst GPU link, and the operator's pod bookkeeping.")

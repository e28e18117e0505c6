"""Why a job cannot go on: the errors that end it, each with the reason code the operator reports
(`kuberl.spec.contract.Reason`). `kuberl.library` re-exports them; `kuberl run` exits on any `JobFailed`."""

from __future__ import annotations

from kuberl.spec.contract import Reason


class JobFailed(RuntimeError):
    """The job cannot go on (a role spent its restart budget); the message names the role and reason."""

    reason = Reason.REACHED_MAX_RESTARTS


class PlacementDegraded(JobFailed):
    """`spec.placement.policy: required` and a role's GPU groups are linked below `minLink`."""

    reason = Reason.PLACEMENT_DEGRADED


class CheckpointUntrusted(JobFailed):
    """A checkpoint the job was to load is not known to be its own: the job record (job.json) changed while it
    ran, or the DCP index refers to code (`kuberl.resilience.dcp_reader`). Nothing of it is loaded."""

    reason = Reason.CHECKPOINT_REFUSED

"""What the driver reports: its progress ConfigMap, and its Job's outcome.

The driver patches ConfigMap ``<job>-progress`` (name in env ``Env.PROGRESS_CONFIGMAP``, namespace in
``Env.NAMESPACE``) so that ``data.progress`` is a `kuberl.spec.contract.ProgressDocument`, the one
model both sides use. Whether the run ended comes from the driver Job (Complete / Failed), which
belongs to the current run; a failed report's ``reason`` and ``message`` say why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kuberl.spec.contract import ProgressDocument

Progress = ProgressDocument  # what the status decisions read of the driver's report


def parse_progress(text: str | None) -> Progress:
    """Parse ``data.progress``; anything malformed is ignored rather than trusted."""
    return ProgressDocument.parse(text)


@dataclass(frozen=True)
class DriverOutcome:
    succeeded: bool
    message: str


def driver_outcome(job: Mapping[str, Any] | None) -> DriverOutcome | None:
    """Complete or Failed from a batch/v1 Job's conditions; None while it runs (or is absent)."""
    for cond in ((job or {}).get("status") or {}).get("conditions", []):
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return DriverOutcome(True, "the driver finished")
        if cond.get("type") == "Failed":
            detail = cond.get("message") or cond.get("reason") or "no reason given"
            return DriverOutcome(False, f"the driver Job failed: {detail}")
    return None

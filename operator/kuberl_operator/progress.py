"""What the driver reports: its progress ConfigMap, and its Job's outcome.

Contract with the runtime: the driver patches ConfigMap ``<job>-progress`` (name in env
``KUBERL_PROGRESS_CONFIGMAP``, namespace in ``KUBERL_NAMESPACE``) so that ``data.progress`` is JSON::

    {"step": 12, "totalSteps": 60, "tokensPerSec": 5321.5, "phase": "Running", "message": "...",
     "reason": "PlacementDegraded", "roles": {"critic": {"restarts": 1, "worstLink": "PIX"}}}

Every key is optional. Whether the run ended comes from the driver Job (Complete / Failed), which
belongs to the current run; a failed report's ``reason`` and ``message`` say why.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Progress:
    step: int | None = None
    total_steps: int | None = None
    tokens_per_sec: float | None = None
    phase: str | None = None
    message: str | None = None
    reason: str | None = None  # a CamelCase condition reason, e.g. PlacementDegraded
    role_restarts: Mapping[str, int] = field(default_factory=dict)
    role_links: Mapping[str, str] = field(default_factory=dict)  # worst GPU link per role, e.g. PIX


def _number(value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return kind(value)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")  # what Kubernetes accepts as a reason


def parse_progress(text: str | None) -> Progress:
    """Parse ``data.progress``; anything malformed is ignored rather than trusted."""
    try:
        data = json.loads(text or "{}")
    except ValueError:
        return Progress()
    if not isinstance(data, dict):
        return Progress()
    roles = data.get("roles") if isinstance(data.get("roles"), dict) else {}
    roles = {role: r for role, r in roles.items() if isinstance(r, dict)}
    reason = _text(data.get("reason"))
    return Progress(
        step=_number(data.get("step"), int),
        total_steps=_number(data.get("totalSteps"), int),
        tokens_per_sec=_number(data.get("tokensPerSec"), float),
        phase=_text(data.get("phase")),
        message=_text(data.get("message")) or None,
        reason=reason if reason and REASON.match(reason) else None,
        role_restarts={role: int(r["restarts"]) for role, r in roles.items() if _number(r.get("restarts"), int) is not None},
        role_links={role: r["worstLink"] for role, r in roles.items() if _text(r.get("worstLink"))},
    )


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

"""Kubernetes-style conditions: type, status, reason, message, observedGeneration, lastTransitionTime."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

READY = "Ready"
ADMITTED = "Admitted"  # may run: spec.suspend false (a queue's admission) and the spec accepted
PROGRESSING = "Progressing"  # on its way to an end: Provisioning, Running or Restarting
SUSPENDED = "Suspended"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
TERMINAL = (SUCCEEDED, FAILED)
Change = tuple[str, bool, str, str]  # a condition to set: type, status, reason, message


def find(conditions: Sequence[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def is_true(conditions: Sequence[Mapping[str, Any]], type_: str) -> bool:
    cond = find(conditions, type_)
    return cond is not None and cond.get("status") == "True"


def terminal(conditions: Sequence[Mapping[str, Any]]) -> str | None:
    """The terminal condition type that holds (sticky: nothing clears it), or None."""
    return next((t for t in TERMINAL if is_true(conditions, t)), None)


def set_condition(
    conditions: Sequence[Mapping[str, Any]], type_: str, status: bool, reason: str, message: str,
    generation: int, now: str,
) -> list[dict[str, Any]]:
    """A new list with one condition set; lastTransitionTime moves only when the status flips."""
    value = "True" if status else "False"
    old = find(conditions, type_)
    kept = old is not None and old.get("status") == value and old.get("lastTransitionTime")
    since = old["lastTransitionTime"] if kept else now
    new = {"type": type_, "status": value, "reason": reason, "message": message,
           "observedGeneration": generation, "lastTransitionTime": since}
    if old is None:
        return [dict(c) for c in conditions] + [new]
    return [new if c.get("type") == type_ else dict(c) for c in conditions]


def set_conditions(conditions: Sequence[Mapping[str, Any]], changes: Iterable[Change], generation: int,
                   now: str) -> list[dict[str, Any]]:
    """A new list with each of ``changes`` set in turn (`set_condition`)."""
    out = [dict(c) for c in conditions]
    for type_, status, reason, message in changes:
        out = set_condition(out, type_, status, reason, message, generation, now)
    return out

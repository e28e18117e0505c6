"""Spec changes of a running job: what the running RayCluster and driver were made from, and which
fields have changed since (docs/operator.md, "Spec changes").

The RayCluster carries the spec it was built from (annotation ``kuberl.io/applied-spec``, the
validated spec as JSON, defaults filled in); the status lists the fields that differ from the job's
current spec under ``pendingChanges`` until a suspend and resume rebuilds the runtime from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from kuberl.spec import JobSpec, RLTrainingJob

APPLIED_SPEC = "kuberl.io/applied-spec"
LIVE = frozenset({"spec.suspend"})  # applied by the operator at once; everything else waits for a resume


def spec_json(job: RLTrainingJob) -> dict[str, Any]:
    """The job's validated spec with defaults, as the annotation holds it."""
    return job.spec.model_dump(mode="json", by_alias=True, exclude_none=True)


def applied_annotation(job: RLTrainingJob) -> dict[str, str]:
    return {APPLIED_SPEC: json.dumps(spec_json(job), sort_keys=True, separators=(",", ":"))}


def applied_spec(cluster: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The spec a RayCluster was built from; None for one without the annotation (or unreadable)."""
    text = (((cluster or {}).get("metadata") or {}).get("annotations") or {}).get(APPLIED_SPEC)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def changed_fields(old: Any, new: Any, path: str = "spec") -> list[str]:
    """Dotted paths whose values differ (maps compared key by key; lists and scalars as a whole)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [f for key in sorted(old.keys() | new.keys())
                for f in changed_fields(old.get(key), new.get(key), f"{path}.{key}")]
    return [] if old == new else [path]


def with_current_defaults(applied: Mapping[str, Any]) -> dict[str, Any]:
    """An applied spec with the defaults of this operator's spec model filled in: a field added since an older
    operator wrote the annotation is the same default in both, not a change. As written when this model refuses it."""
    try:
        return JobSpec.model_validate(dict(applied)).model_dump(mode="json", by_alias=True, exclude_none=True)
    except ValidationError:
        return dict(applied)


def unapplied_changes(applied: Mapping[str, Any] | None, job: RLTrainingJob) -> list[str]:
    """Fields changed since the runtime was built that it does not have yet (none when unknown)."""
    if applied is None:
        return []
    return [f for f in changed_fields(with_current_defaults(applied), spec_json(job)) if f not in LIVE]

"""Spec changes of a running job: the RayCluster remembers the spec it was built from, and the status
lists what changed since, until a resume rebuilds the runtime."""

from __future__ import annotations

from typing import Any

from kuberl.spec import validate_manifest
from kuberl_operator import builders
from kuberl_operator.health import PodView
from kuberl_operator.spec_changes import APPLIED_SPEC, applied_spec, changed_fields, unapplied_changes
from kuberl_operator.status import Observed, decide

OPTS = builders.BuildOptions(namespace="ml", image="runtime:1")
T1 = "2026-01-01T00:01:00Z"


def job(**spec: Any):
    base = {"data": {"task": "repeat-letter"}, "reward": {"function": "m.n:f"}, "trainer": {"microBatchSize": 1}}
    return validate_manifest({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
                              "spec": {**base, **spec}})


def test_the_raycluster_carries_the_spec_it_was_built_from(validator) -> None:
    cluster = builders.ray_cluster(job(), OPTS)
    assert APPLIED_SPEC in cluster["metadata"]["annotations"] and validator(cluster) == []
    assert unapplied_changes(applied_spec(cluster), job()) == []  # defaults written out: nothing differs
    later = job(trainer={"microBatchSize": 1, "steps": 99}, roles={"ref": {"replicas": 2}}, suspend=True)
    assert unapplied_changes(applied_spec(cluster), later) == ["spec.roles.ref.replicas", "spec.trainer.steps"]
    assert applied_spec({"metadata": {"annotations": {APPLIED_SPEC: "{not json"}}}) is None
    assert unapplied_changes(None, later) == []  # a cluster made before the annotation existed: unknown
    assert changed_fields({"a": [1], "b": {"c": 1}}, {"a": [2], "b": {}}) == ["spec.a", "spec.b.c"]


def test_a_field_added_by_an_operator_upgrade_is_no_pending_change() -> None:
    """A RayCluster built by an older operator has no annotation entry for a field added since (its default): the
    running job shows no pending change for it, while a real change still shows."""
    older = applied_spec(builders.ray_cluster(job(), OPTS))
    del older["trainer"]["packing"]  # added in the newer operator, with its default
    assert unapplied_changes(older, job()) == []
    assert unapplied_changes(older, job(trainer={"microBatchSize": 1, "packing": True})) == ["spec.trainer.packing"]


def test_status_lists_pending_changes_until_the_runtime_has_them(validator) -> None:
    pods = tuple(PodView(f"{r}0", f"u-{r}", r, "rc", True, None, False) for r in ("actor", "critic", "ref", "reward"))
    built = applied_spec(builders.ray_cluster(job(), OPTS))
    changed = job(trainer={"microBatchSize": 1, "steps": 99})
    st = decide(changed, 2, {}, Observed("rc", pods, applied_spec=built), T1).status
    assert st["pendingChanges"] == ["spec.trainer.steps"] and st["phase"] == "Running"
    body = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
            "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "m.n:f"}}, "status": st}
    assert validator(body) == []  # declared in the CRD: a real API server keeps it
    rebuilt = applied_spec(builders.ray_cluster(changed, OPTS))
    assert "pendingChanges" not in decide(changed, 2, st, Observed("rc", pods, applied_spec=rebuilt), T1).status
    assert "pendingChanges" not in decide(changed, 2, st, Observed(None), T1).status  # no runtime: nothing pending
    suspended = job(trainer={"microBatchSize": 1, "steps": 99}, suspend=True)  # its cluster is still going
    assert "pendingChanges" not in decide(suspended, 3, st, Observed("rc", pods, applied_spec=built), T1).status

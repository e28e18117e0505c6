"""The operator's cache (watch-backed indices and its own writes) and its count of API requests."""

from __future__ import annotations

import pytest

from kuberl_operator.api_traffic import classify
from kuberl_operator.cache import Written, first, kept, newest, version


def obj(name: str, rv: str | None, **extra: object) -> dict:
    meta = {"name": name, "namespace": "ns", **({"resourceVersion": rv} if rv is not None else {})}
    return {"metadata": meta, **extra}


def test_the_newer_of_index_and_write_wins() -> None:
    old, new = obj("a", "10"), obj("a", "12")
    assert newest(old, new) is new and newest(new, old) is new
    assert newest(new, obj("a", "12")) is new  # the index caught up: it wins
    assert newest(None, new) is new and newest(old, None) is old and newest(None, None) is None
    assert version(obj("a", None)) == -1 and version(obj("a", "x")) == -1 and version(None) == -1


def test_a_write_is_read_until_the_index_holds_it_then_dropped() -> None:
    w = Written()
    w.put("configmaps", obj("c", "7", data={"x": "1"}))
    assert w.read("configmaps", "ns", "c", None)["data"] == {"x": "1"}  # created, not yet indexed
    assert w.read("configmaps", "ns", "c", obj("c", "5"))["metadata"]["resourceVersion"] == "7"  # stale index
    indexed = obj("c", "8")
    assert w.read("configmaps", "ns", "c", indexed) is indexed and not w.bodies
    w.put("configmaps", obj("j-spec", "3"))
    w.put("rltrainingjobs", obj("j", "4"))
    w.put("rltrainingjobs", obj("k", "4"))
    w.forget("ns", "j", ("j-spec",))
    assert list(w.bodies) == [("rltrainingjobs", "ns", "k")]
    w.put("pods", None)  # a write that returned nothing (a Status) keeps nothing
    assert len(w.bodies) == 1
    w.drop("rltrainingjobs", "ns", "k")  # its watch said it was deleted
    assert not w.bodies and w.read("rltrainingjobs", "ns", "k", None) is None


def test_the_cache_keeps_what_a_reconcile_reads_and_no_pod_template() -> None:
    meta = {"name": "j", "namespace": "ns", "uid": "u", "managedFields": [{"manager": "kopf"}]}
    group = {"groupName": "actor", "replicas": 2, "minReplicas": 2, "maxReplicas": 2, "template": {"spec": {}}}
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": meta, "status": {"state": "ready"},
               "spec": {"headGroupSpec": {"template": {}}, "workerGroupSpecs": [group]}}
    assert kept("rayclusters", cluster) == {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
        "spec": {"workerGroupSpecs": [{"groupName": "actor", "replicas": 2, "minReplicas": 2, "maxReplicas": 2}],
                 "suspend": False}}
    assert kept("rayclusters", {**cluster, "spec": {**cluster["spec"], "suspend": True}})["spec"]["suspend"] is True
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {"template": {}}, "status": {}}
    assert set(kept("jobs", job)) == {"apiVersion", "kind", "metadata"}
    assert kept("configmaps", {"metadata": meta, "data": {"a": "1"}})["data"] == {"a": "1"}
    rltj = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": meta, "spec": {}, "status": {}}
    assert kept("rltrainingjobs", rltj) == {**rltj, "metadata": {"name": "j", "namespace": "ns", "uid": "u"}}


def test_first_reads_one_value_of_a_store() -> None:
    assert first(None) is None and first([]) is None and first([{"a": 1}]) == {"a": 1}


@pytest.mark.parametrize(("method", "url", "expected"), [
    ("GET", "https://h/api/v1/namespaces/ns/pods?labelSelector=x", ("list", "pods")),
    ("GET", "https://h/api/v1/pods?watch=true&resourceVersion=5", ("watch", "pods")),
    ("GET", "https://h/apis/kuberl.io/v1alpha1/namespaces/ns/rltrainingjobs/j", ("get", "rltrainingjobs")),
    ("PATCH", "https://h/apis/kuberl.io/v1alpha1/namespaces/ns/rltrainingjobs/j/status",
     ("patch", "rltrainingjobs/status")),
    ("POST", "https://h/api/v1/namespaces/ns/secrets", ("create", "secrets")),
    ("DELETE", "https://h/apis/ray.io/v1/namespaces/ns/rayclusters/c", ("delete", "rayclusters")),
    ("GET", "https://h/apis/apiextensions.k8s.io/v1/customresourcedefinitions?watch=true",
     ("watch", "customresourcedefinitions")),
    ("GET", "https://h/api/v1/namespaces/ns", ("get", "namespaces")),
    ("GET", "https://h/apis", ("get", "discovery")),
    ("GET", "https://h/version", ("get", "version")),
])
def test_requests_are_named_as_the_audit_log_names_them(method: str, url: str, expected: tuple[str, str]) -> None:
    assert classify(method, url) == expected

"""Attacks with the operator's own token, on the real API server: what a compromised operator could do.

The chart's RBAC lets the operator create Jobs, RayClusters, Roles, RoleBindings, ConfigMaps, Secrets and
NetworkPolicies in every namespace; its ValidatingAdmissionPolicies (charts/kuberl/templates/operator-policy.yaml)
hold each write to the objects of one RLTrainingJob, and its deletes of RLTrainingJobs to finished ones that set
spec.ttlSecondsAfterFinished. Every attack here is a request the RBAC alone would allow (or,
for the Secret reads, that the RBAC no longer allows), made with the chart's ServiceAccount token against the real
kube-apiserver, and each must be refused. That the operator still does its work under the policies is what
the rest of tests/cluster shows: it runs there with this same token.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from localkube.api import (
    CONFIGMAPS,
    JOBS,
    NETWORKPOLICIES,
    PODS,
    RLTJ,
    ROLEBINDINGS,
    ROLES,
    SECRETS,
    Api,
    ApiError,
)
from localkube.stack import Cluster

from kuberl_operator import builders

from .conftest import OPERATOR_NAMESPACE
from .jobs import manifest
from .rbac import ATTACKER_AGENT

pytestmark = pytest.mark.netns


@pytest.fixture(scope="module")
def as_operator(cluster: Cluster, admin: Api, release: str) -> Api:
    """A client holding only the chart's ServiceAccount token, as the operator's pod does (its own user agent
    keeps its requests out of test_rbac.py's audit of what the operator asks for)."""
    api = Api(cluster.server, cluster.pki / "ca.crt", token=admin.token(OPERATOR_NAMESPACE, release))
    api.headers["User-Agent"] = ATTACKER_AGENT
    return api


@pytest.fixture
def owned(ns: Api, job_name: str) -> dict[str, Any]:
    """Metadata that passes the ownership rules: labelled for, and owned by, a real (suspended) job."""
    job = ns.create(RLTJ, manifest(job_name, suspend=True))
    owner = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "name": job_name,
             "uid": job["metadata"]["uid"]}
    return {"labels": {"kuberl.io/job": job_name}, "ownerReferences": [owner]}


def refused(call: Any, *args: Any, **kwargs: Any) -> str:
    """The API server's 403 message for a call that must be refused."""
    with pytest.raises(ApiError) as err:
        call(*args, **kwargs)
    assert err.value.status == 403, err.value
    return err.value.message


def driver_job(name: str, metadata: dict[str, Any], **pod: Any) -> dict[str, Any]:
    spec = {"restartPolicy": "Never", "serviceAccountName": f"{metadata['labels']['kuberl.io/job']}-driver",
            "containers": [{"name": "driver", "image": "kuberl-runtime:test"}], **pod}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, **copy.deepcopy(metadata)},
            "spec": {"template": {"metadata": {"labels": metadata["labels"]}, "spec": spec}}}


def test_the_operator_cannot_read_any_secret(ns: Api, as_operator: Api, owned: dict[str, Any]) -> None:
    ns.create(SECRETS, {"metadata": {"name": "db-password"}, "stringData": {"password": "hunter2"}})
    op = as_operator.in_namespace(ns.namespace)
    assert "forbidden" in refused(op.get, SECRETS, "db-password")
    refused(op.list, SECRETS)
    # It can make a job's token Secret, once, and then not read it back either.
    job = owned["labels"]["kuberl.io/job"]
    op.create(SECRETS, {"metadata": {"name": f"{job}-made", **owned}, "type": "Opaque", "immutable": True,
                        "stringData": {"auth_token": "t"}})
    refused(op.get, SECRETS, f"{job}-made")
    refused(op.patch, SECRETS, "db-password", {"stringData": {"password": "x"}})


def test_the_operator_cannot_mint_a_service_account_token(ns: Api, as_operator: Api, owned: dict[str, Any]) -> None:
    secret = {"metadata": {"name": "minted", **owned, "annotations": {"kubernetes.io/service-account.name": "default"}},
              "type": "kubernetes.io/service-account-token"}
    assert "only Opaque Secrets" in refused(as_operator.in_namespace(ns.namespace).create, SECRETS, secret)


def test_the_operator_cannot_run_a_job_as_another_service_account(ns: Api, as_operator: Api,
                                                                  owned: dict[str, Any]) -> None:
    op = as_operator.in_namespace(ns.namespace)
    job = owned["labels"]["kuberl.io/job"]
    assert f"{job}-driver" in refused(op.create, JOBS, driver_job("as-default", owned, serviceAccountName="default"))
    # Nor, as its own driver, read another Secret, mount the host, or join its network.
    ns.create(SECRETS, {"metadata": {"name": "db-password"}, "stringData": {"password": "hunter2"}})
    mounts_secret = driver_job("mounts", owned, volumes=[{"name": "s", "secret": {"secretName": "db-password"}}])
    assert "no host path, no Secret but" in refused(op.create, JOBS, mounts_secret)
    # A projected volume may hold the pod's own API token (the reporter's), but no Secret, nor a token for
    # another audience.
    token = builders.api_token_volume()
    for source in ({"secret": {"name": "db-password"}},
                   {"serviceAccountToken": {"path": "t", "audience": "https://vault.example.com"}}):
        bad = copy.deepcopy(token)
        bad["projected"]["sources"].append(source)
        assert "projected volume but the pod's own API token" in refused(
            op.create, JOBS, driver_job("projects", owned, volumes=[bad]))
    env = [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "db-password", "key": "password"}}}]
    reads_secret = driver_job("reads", owned)
    reads_secret["spec"]["template"]["spec"]["containers"][0]["env"] = env
    assert "read no Secret" in refused(op.create, JOBS, reads_secret)
    host = driver_job("host", owned, volumes=[{"name": "h", "hostPath": {"path": "/"}}])
    refused(op.create, JOBS, host)
    refused(op.create, JOBS, driver_job("net", owned, hostNetwork=True))
    # Unlabelled, or labelled for a job that does not own it, it is refused before any of that.
    unowned = {"labels": owned["labels"]}
    assert "owned by the RLTrainingJob" in refused(op.create, JOBS, driver_job("unowned", unowned))
    # The job's own driver, as the operator makes it, passes: its reporter's API token included.
    op.create(JOBS, driver_job("fine", owned, volumes=[token]))


def test_the_operator_cannot_fence_off_pods_of_others_with_a_network_policy(ns: Api, as_operator: Api,
                                                                           owned: dict[str, Any]) -> None:
    """A NetworkPolicy that selects a pod makes it refuse what the policy does not admit: one of the operator's
    selects its own job's pods only, so it cannot cut off another job's or anyone's pods in the namespace."""
    op = as_operator.in_namespace(ns.namespace)
    job = owned["labels"]["kuberl.io/job"]

    def policy(name: str, selector: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": name, **owned}, "spec": {"podSelector": selector, "policyTypes": ["Ingress"]}}

    for name, selector in (("everyone", {}), ("other-job", {"matchLabels": {"kuberl.io/job": "other"}}),
                           ("by-expression", {"matchExpressions": [{"key": "app", "operator": "Exists"}]})):
        assert "selects only the pods of its own job" in refused(op.create, NETWORKPOLICIES, policy(name, selector))
    # One that selects its own job's pods passes (named apart from the `<job>-network` the operator itself
    # makes for the suspended job, which may already exist).
    op.create(NETWORKPOLICIES, policy(f"{job}-own", {"matchLabels": {"kuberl.io/job": job}}))


def test_the_operator_may_change_a_pod_only_by_lifting_its_gang_gate(ns: Api, as_operator: Api,
                                                                     owned: dict[str, Any]) -> None:
    """Gang scheduling lets it patch pods (to lift the kuberl.io/gang gate); the admission policy holds every pod
    change to exactly that: a new image, a relabel, a toleration or a node selector is refused, as is a patch of a
    pod that carries no gate of ours."""
    gates = [{"name": "kuberl.io/gang"}, {"name": "example.com/other"}]
    pod = ns.create(PODS, {"metadata": {"name": "gated", "labels": owned["labels"]}, "spec": {
        "schedulingGates": gates, "containers": [{"name": "c", "image": "kuberl-runtime:test"}]}})
    op = as_operator.in_namespace(ns.namespace)
    words = "only to lift its kuberl.io/gang scheduling gate"
    keep_other = {"op": "replace", "path": "/spec/schedulingGates", "value": gates[1:]}  # ours lifted beside it
    for change in ([{"op": "replace", "path": "/spec/containers/0/image", "value": "docker.io/evil/miner:1"}],
                   [{"op": "add", "path": "/metadata/labels/extra", "value": "x"}],
                   [{"op": "add", "path": "/spec/tolerations/-", "value": {"operator": "Exists"}}, keep_other],
                   [{"op": "add", "path": "/spec/nodeSelector", "value": {"kubernetes.io/hostname": "gpu-0"}},
                    keep_other],
                   [{"op": "replace", "path": "/spec/schedulingGates", "value": [gates[0]]}],  # not ours lifted
                   [{"op": "remove", "path": "/spec/schedulingGates"}]):  # ours and the other's at once
        with pytest.raises(ApiError) as err:
            op.request("PATCH", op.url(PODS, "gated", ns.namespace, None), change, "application/json-patch+json")
        assert err.value.status == 403 and words in err.value.message, (change, err.value)
    lifted = op.patch(PODS, "gated", {"spec": {"schedulingGates": gates[1:]}})
    assert lifted["spec"]["schedulingGates"] == gates[1:]
    assert words in refused(op.patch, PODS, "gated", {"spec": {"schedulingGates": None}})  # ours is gone already
    assert pod["spec"]["containers"][0]["image"] == ns.get(PODS, "gated")["spec"]["containers"][0]["image"]


def test_the_operator_cannot_delete_a_job_unless_it_finished_with_a_ttl(ns: Api, as_operator: Api,
                                                                       owned: dict[str, Any]) -> None:
    """Its RBAC lets it delete RLTrainingJobs (spec.ttlSecondsAfterFinished); the admission policy holds that to
    finished jobs that asked for it: a running (here suspended) job without a TTL stays."""
    job = owned["labels"]["kuberl.io/job"]
    assert "ttlSecondsAfterFinished" in refused(as_operator.in_namespace(ns.namespace).delete, RLTJ, job)
    assert ns.get(RLTJ, job) is not None


def test_the_operator_cannot_patch_a_configmap_it_does_not_own(ns: Api, admin: Api, as_operator: Api,
                                                               owned: dict[str, Any]) -> None:
    ns.create(CONFIGMAPS, {"metadata": {"name": "team-config"}, "data": {"a": "1"}})
    op = as_operator.in_namespace(ns.namespace)
    assert "labelled kuberl.io/job" in refused(op.patch, CONFIGMAPS, "team-config", {"data": {"a": "2"}})
    # Labelling it in the same patch does not help: it must have been labelled before.
    relabel = {"metadata": {"labels": owned["labels"]}, "data": {"a": "2"}}
    assert "labelled for the same job" in refused(op.patch, CONFIGMAPS, "team-config", relabel)
    refused(op.delete, CONFIGMAPS, "team-config")
    assert ns.get(CONFIGMAPS, "team-config")["data"] == {"a": "1"}
    # Nor anything in kube-system, labelled or not.
    admin.create(CONFIGMAPS, {"metadata": {"name": "coredns-like", "labels": owned["labels"]}, "data": {}},
                 namespace="kube-system")
    try:
        assert "kube-system" in refused(op.patch, CONFIGMAPS, "coredns-like", {"data": {"x": "y"}},
                                        namespace="kube-system")
    finally:
        admin.delete(CONFIGMAPS, "coredns-like", namespace="kube-system")


def test_the_operator_cannot_grant_more_through_roles(ns: Api, as_operator: Api, owned: dict[str, Any]) -> None:
    op = as_operator.in_namespace(ns.namespace)
    job = owned["labels"]["kuberl.io/job"]
    role = {"metadata": {"name": f"{job}-driver", **owned},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}
    assert "progress ConfigMap" in refused(op.create, ROLES, role)  # RBAC alone allows it: the operator lists them
    role["rules"] = [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [f"{job}-progress"],
                      "verbs": ["get", "patch"]}]
    try:
        op.create(ROLES, role)  # the driver's Role, as the operator makes it, passes
    except ApiError as exc:
        assert exc.status == 409, exc  # or the running operator made it first, for the job
    binding = {"metadata": {"name": f"{job}-driver", **owned},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{job}-driver"},
               "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns.namespace}]}
    assert "to its ServiceAccount" in refused(op.create, ROLEBINDINGS, binding)

"""The chart's RBAC is exactly what the operator uses: no 403 in the audit log (nothing missing) and
every granted verb exercised (nothing unused), or granted on to the driver's Role (RBAC lets only a holder
grant a permission: the operator reads from its cache, and holds configmaps get only for the driver).
The scenario here makes the operator use each verb:
create, adopt (patch) what `kuberl render | kubectl apply` made, restart a role, suspend, delete."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from localkube.api import RAYCLUSTERS, RESOURCECLAIMTEMPLATES, RLTJ, ROLES, Api
from localkube.stack import Cluster

from .conftest import OPERATOR_NAMESPACE, OPERATOR_USER
from .faults import fail_pod
from .jobs import describe, manifest, pods_of, status
from .operator_process import OperatorProcess, kuberl_command
from .rbac import audit_events, forbidden, granted, rules_of, used
from .test_operator_ha import ELECTION, LEASES, leading
from .waits import wait_for

pytestmark = pytest.mark.netns


def render(ns: Api, body: dict, tmp_path: Path) -> list[dict]:
    path = tmp_path / f"{body['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(body))
    out = subprocess.run(
        [*kuberl_command(), "render", str(path), "-n", ns.namespace, "--image", "kuberl-runtime:test"],
        capture_output=True,
        text=True,
        check=True,
    )
    return list(yaml.safe_load_all(out.stdout))


def adopted(ns: Api, obj: dict, owner_uid: str) -> bool:
    from localkube import api as kapi

    plural = {
        "ConfigMap": kapi.CONFIGMAPS,
        "Secret": kapi.SECRETS,
        "ServiceAccount": kapi.SERVICEACCOUNTS,
        "Role": kapi.ROLES,
        "RoleBinding": kapi.ROLEBINDINGS,
        "RayCluster": RAYCLUSTERS,
        "Job": kapi.JOBS,
        "ResourceClaimTemplate": RESOURCECLAIMTEMPLATES,
    }[obj["kind"]]
    live = ns.get(plural, obj["metadata"]["name"]) or {}
    return any(o["uid"] == owner_uid for o in live.get("metadata", {}).get("ownerReferences", []))


def test_the_chart_grants_exactly_what_the_operator_uses(
    cluster: Cluster, ns: Api, admin: Api, operator: OperatorProcess, release: str, kubectl, tmp_path: Path,
    operator_kubeconfig: Path,
) -> None:
    # 1. Made beforehand, unowned (`kuberl render job.yaml | kubectl apply -f -`): the operator adopts each.
    rendered = manifest("adopted")
    objects = render(ns, rendered, tmp_path)
    kubectl("apply", "--server-side", "-n", ns.namespace, "-f", "-", stdin=yaml.safe_dump_all(objects))
    job = ns.create(RLTJ, rendered)
    ctx = lambda: describe(ns, "adopted") + operator.tail(30)  # noqa: E731
    # Not the NetworkPolicy: the operator only creates those (a 409 tells it one is there), so one applied by hand
    # stays the user's (docs/operator.md).
    for obj in [o for o in objects if o["kind"] != "NetworkPolicy"]:
        wait_for(lambda obj=obj: adopted(ns, obj, job["metadata"]["uid"]), 60, f"{obj['kind']} adopted", ctx)
    wait_for(lambda: status(ns, "adopted").get("phase") == "Running", 90, "Running", ctx)
    delegated = rules_of(ns.get(ROLES, "adopted-driver"))  # the driver's Role, made by (or adopted from) the operator
    fail_pod(ns, pods_of(ns, "adopted", "critic")[0]["metadata"]["name"], "exit")  # the gang goes: pods delete
    wait_for(lambda: status(ns, "adopted")["roles"]["critic"]["restarts"] == 1, 60, "a critic restart", ctx)

    # 2. GPU claim templates (DRA): one made beforehand (adopted), the others created; suspend deletes them.
    dra = manifest("dra", placement={"mode": "dra"})
    template = next(o for o in render(ns, dra, tmp_path) if o["kind"] == "ResourceClaimTemplate")
    ns.create(RESOURCECLAIMTEMPLATES, template)
    dra_job = ns.create(RLTJ, dra)
    wait_for(
        lambda: (
            adopted(ns, template, dra_job["metadata"]["uid"])
            and len(ns.list(RESOURCECLAIMTEMPLATES, "kuberl.io/job=dra")) == 3
        ),
        60,
        "claim templates adopted and created",
        lambda: describe(ns, "dra") + operator.tail(30),
    )
    for name in ("adopted", "dra"):
        ns.patch(RLTJ, name, {"spec": {"suspend": True}})
    wait_for(lambda: not ns.list(RESOURCECLAIMTEMPLATES) and not ns.list(RAYCLUSTERS), 60, "suspended", ctx)

    # 3. Delete: the operator deletes what the job owns, then releases its finalizer.
    for name in ("adopted", "dra"):
        ns.delete(RLTJ, name)
    wait_for(lambda: not ns.list(RLTJ), 60, "both jobs gone", ctx)
    # 4. A job that finished (past its spec.activeDeadlineSeconds) and whose TTL passed: the operator deletes it.
    ns.create(RLTJ, manifest("expiring", activeDeadlineSeconds=2, ttlSecondsAfterFinished=0))
    wait_for(lambda: ns.get(RLTJ, "expiring") is None, 60, "the expired job deleted by the operator", ctx)

    # 5. The leader election of the chart's replicas: a replica creates its Lease, reads and renews it, and
    # releases it as it stops (beside the session's operator, while no job is left for either to act on).
    admin.delete(LEASES, release, namespace=OPERATOR_NAMESPACE)  # another test's, if any: the create is exercised
    elected = OperatorProcess(operator_kubeconfig, tmp_path, extra=ELECTION)  # -A, as the chart's
    elected.start()
    try:
        wait_for(lambda: leading(elected), 30, "the elected replica to lead", elected.tail)
    finally:
        elected.stop()

    events = audit_events(cluster.audit_log, OPERATOR_USER)
    assert events, f"no audit events for {OPERATOR_USER} in {cluster.audit_log}"
    assert forbidden(events) == [], "the chart's RBAC is missing what the operator asked for"
    lease_role = rules_of(admin.get(ROLES, f"{release}-leader", namespace=OPERATOR_NAMESPACE))
    grants, uses = granted(admin, release) | lease_role, used(events) | delegated
    assert sorted(grants - uses) == [], "granted but never used"
    assert sorted(uses - grants) == []

"""`kuberl validate JOB --cluster`: can this cluster run this job? Asked of the cluster before anything is made.

``read(job)`` asks the API server (reads, a SelfSubjectAccessReview and a dry-run create, which persists
nothing); ``problems(job, facts)`` is pure: one line per problem, naming the field or object and the fix. The pods
checked are those the operator would make with the chart's default sizes (`kuberl render`'s).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import kopf

from kuberl.spec import API_VERSION, GROUP, PLURAL, VERSION, RLTrainingJob, generate_crd
from kuberl.spec.quantity import QuantityError, format_quantity, parse_quantity

from . import builders, names

KUBERAY_TESTED = "v1.5.0"  # the KubeRay the local stack builds (cluster/gomod/kuberay)
QUEUE_LABEL = names.QUEUE_LABEL
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CONDITION_TAINTS = "node.kubernetes.io/"  # taints the node lifecycle sets and lifts (not-ready, unreachable, pressure)
DETAILS = 3  # node reasons shown per problem
Call = Callable[..., tuple[int, Any]]  # sync_client.request's shape


@dataclass
class Facts:
    """What the cluster said. None: absent (404); a string under ``unreadable``: the read was refused."""

    namespace: str
    crd: dict[str, Any] | None = None
    leases: list[dict[str, Any]] = field(default_factory=list)
    kuberay_crd: dict[str, Any] | None = None
    nodes: list[dict[str, Any]] = field(default_factory=list)
    may_create: bool = True
    denied_why: str = ""
    dry_run: tuple[int, str] = (201, "")  # the dry-run create's code and message
    local_queue: dict[str, Any] | None = None
    kueue_installed: bool = False
    device_classes: dict[str, bool] = field(default_factory=dict)  # name -> exists
    claim: dict[str, Any] | None = None
    unreadable: dict[str, str] = field(default_factory=dict)  # what -> why (403 and the like)
    now: datetime = field(default_factory=lambda: datetime.now(UTC))


def rendered(job: RLTrainingJob, namespace: str, kind: str) -> list[dict[str, Any]]:
    """The objects of ``kind`` the operator would make for the job (with the chart's default pod sizes)."""
    return [o for o in builders.runtime_objects(job, builders.BuildOptions(namespace=namespace)) if o["kind"] == kind]


def pods_of(job: RLTrainingJob, namespace: str) -> dict[str, dict[str, Any]]:
    """name -> pod spec of every pod kind the operator makes for the job: the head, one per role, the driver."""
    [cluster], [driver] = rendered(job, namespace, "RayCluster"), rendered(job, namespace, "Job")
    pods = {"head": cluster["spec"]["headGroupSpec"]["template"]["spec"]}
    pods.update({f"roles.{g['groupName']}": g["template"]["spec"] for g in cluster["spec"]["workerGroupSpecs"]})
    pods["driver"] = driver["spec"]["template"]["spec"]
    return pods


def device_classes(job: RLTrainingJob, namespace: str) -> set[str]:
    """The DeviceClasses the job's GPU claim templates ask for (placement.mode dra)."""
    return {r["exactly"]["deviceClassName"] for o in rendered(job, namespace, "ResourceClaimTemplate")
            for r in o["spec"]["spec"]["devices"]["requests"]}


def read(job: RLTrainingJob, manifest: Mapping[str, Any], namespace: str, call: Call) -> Facts:
    """Ask the cluster everything ``problems`` needs (``manifest``: the job as written; ``call``:
    sync_client.request)."""
    facts = Facts(namespace)

    def get(what: str, path: str, **params: str) -> dict[str, Any] | None:
        code, body = call("GET", path, params=params or None)
        if code == 200:
            return body
        if code != 404:
            facts.unreadable[what] = f"{code} {(body or {}).get('message', '')}".strip()
        return None

    facts.crd = get("the RLTrainingJob CRD", f"{CRD_PATH}/{PLURAL}.{GROUP}")
    leases = get("Leases", "/apis/coordination.k8s.io/v1/leases",
                 labelSelector="app.kubernetes.io/name=kuberl,app.kubernetes.io/component=operator")
    facts.leases = (leases or {}).get("items", [])
    facts.kuberay_crd = get("KubeRay's RayCluster CRD", f"{CRD_PATH}/rayclusters.ray.io")
    facts.nodes = (get("nodes", "/api/v1/nodes") or {}).get("items", [])
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": {"namespace": namespace, "verb": "create", "group": GROUP,
                                              "resource": PLURAL}}}
    code, body = call("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
    if code == 201:
        facts.may_create = bool(body["status"].get("allowed"))
        facts.denied_why = body["status"].get("reason", "")
    body = {**manifest, "metadata": {**manifest.get("metadata", {}), "namespace": namespace}}
    code, body = call("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}", body,
                      params={"dryRun": "All", "fieldValidation": "Strict"})
    facts.dry_run = (code, (body or {}).get("message", "") if isinstance(body, dict) else "")
    if queue := (job.metadata.labels or {}).get(QUEUE_LABEL):
        kueue = get("Kueue's CRDs", f"{CRD_PATH}/localqueues.kueue.x-k8s.io")
        facts.kueue_installed = kueue is not None
        if kueue is not None:  # at the version the installed Kueue serves
            served = next(v["name"] for v in kueue["spec"]["versions"] if v.get("served"))
            facts.local_queue = get("the LocalQueue", f"/apis/kueue.x-k8s.io/{served}/namespaces/{namespace}/"
                                                      f"localqueues/{queue}")
    for name in device_classes(job, namespace):
        facts.device_classes[name] = get(f"DeviceClass {name}", f"/apis/resource.k8s.io/v1/deviceclasses/{name}") \
            is not None
    if claim := job.spec.trainer.checkpoint.volume_claim:
        facts.claim = get(f"PersistentVolumeClaim {claim}",
                          f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
    return facts


def problems(job: RLTrainingJob, facts: Facts) -> list[str]:
    """Every problem, one line each; empty: this cluster can run the job as far as it can be asked."""
    return [*crd_problems(facts), *operator_problems(facts), *access_problems(job, facts),
            *kuberay_problems(job, facts), *fit_problems(job, facts), *queue_problems(job, facts),
            *device_class_problems(facts), *claim_problems(job, facts)]


def crd_problems(facts: Facts) -> Iterator[str]:
    if facts.crd is None:
        if "the RLTrainingJob CRD" not in facts.unreadable:
            yield (f"CRD {PLURAL}.{GROUP} is not installed: install the chart (helm install kuberl charts/kuberl) or "
                   f"`kuberl crd | kubectl apply --server-side -f -`")
        return
    if crd_spec_schema(facts.crd) != crd_spec_schema(generate_crd()):
        yield (f"CRD {PLURAL}.{GROUP} is another kuberl's (its spec schema differs from this kuberl's): fields either "
               f"side lacks are refused or dropped; upgrade the chart, or this CLI, so that they match")


def crd_spec_schema(crd: Mapping[str, Any]) -> Any:
    version = next((v for v in crd["spec"]["versions"] if v["name"] == VERSION), None)
    return version and version["schema"]["openAPIV3Schema"]["properties"].get("spec")


def operator_problems(facts: Facts) -> Iterator[str]:
    if "Leases" in facts.unreadable:
        return
    alive = [lease for lease in facts.leases if renewed_within(lease, facts.now)]
    if not alive:
        yield ("no kuberl operator is running: no operator Lease was renewed lately in any namespace; install the "
               "chart (helm install kuberl charts/kuberl), or run `kuberl operator --leader-elect`")


def renewed_within(lease: Mapping[str, Any], now: datetime) -> bool:
    """Held, and renewed within twice its duration."""
    spec = lease.get("spec") or {}
    if not spec.get("holderIdentity") or not spec.get("renewTime"):
        return False
    try:  # a MicroTime; tolerate one written without the fraction
        renewed = datetime.fromisoformat(spec["renewTime"].replace("Z", "+00:00"))
    except ValueError:
        return False
    return (now - renewed).total_seconds() <= 2 * int(spec.get("leaseDurationSeconds") or 15)


def access_problems(job: RLTrainingJob, facts: Facts) -> Iterator[str]:
    if not facts.may_create:
        why = f" ({facts.denied_why})" if facts.denied_why else ""
        yield (f"you may not create RLTrainingJobs in namespace {facts.namespace}{why}: ask for create on "
               f"{PLURAL}.{GROUP} there (a RoleBinding)")
        return
    code, message = facts.dry_run
    if facts.crd is None:
        return  # the dry run had no kind to create
    if code == 404:
        yield f"namespace {facts.namespace} does not exist: create it, or set metadata.namespace (or -n)"
    elif code == 409:
        yield (f"metadata.name: RLTrainingJob {job.metadata.name} already exists in {facts.namespace}: pick another "
               f"name, or delete it first")
    elif code not in (200, 201):  # RBAC allowed it (above): a 403 here is an admission policy's
        yield f"the API server refuses the job (a dry run): {message}"


def kuberay_problems(job: RLTrainingJob, facts: Facts) -> Iterator[str]:
    if facts.kuberay_crd is None:
        if "KubeRay's RayCluster CRD" not in facts.unreadable:
            yield (f"KubeRay is not installed (no CRD rayclusters.ray.io): install its operator, {KUBERAY_TESTED} or "
                   f"later")
        return
    version = next((v for v in facts.kuberay_crd["spec"]["versions"] if v["name"] == "v1" and v.get("served")), None)
    if version is None:
        yield f"KubeRay's CRD serves no ray.io/v1: upgrade KubeRay to {KUBERAY_TESTED} or later"
        return
    known = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    [cluster] = rendered(job, facts.namespace, "RayCluster")
    missing = sorted(set(cluster["spec"]) - set(known))
    groups = known.get("workerGroupSpecs", {}).get("items", {}).get("properties", {})
    missing += sorted(f"workerGroupSpecs[].{k}" for g in cluster["spec"]["workerGroupSpecs"] for k in g
                      if groups and k not in groups)
    if missing:
        yield (f"KubeRay's RayCluster CRD lacks spec.{', spec.'.join(dict.fromkeys(missing))}, which this job's "
               f"RayCluster uses: upgrade KubeRay to {KUBERAY_TESTED} or later")


def fit_problems(job: RLTrainingJob, facts: Facts) -> Iterator[str]:
    if "nodes" in facts.unreadable:
        return
    for name, pod in pods_of(job, facts.namespace).items():
        need = pod_requests(pod)
        reasons = [why for node in facts.nodes if (why := unfit(pod, need, node))]
        if len(reasons) == len(facts.nodes):
            wants = ", ".join(f"{k}={format_quantity(v)}" for k, v in sorted(need.items()))
            distinct = list(dict.fromkeys(reasons))
            more = f"; and {len(distinct) - DETAILS} more" if len(distinct) > DETAILS else ""
            detail = "; ".join(distinct[:DETAILS]) + more if distinct else "the cluster has no nodes"
            field_ = f"spec.{name}" if name.startswith("roles.") else f"the {name} pod"
            yield f"{field_}: no node can hold one pod ({wants}): {detail}"


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """Resource -> the pod's request (its containers' sum; a limit stands for a missing request, as the API does)."""
    total: dict[str, Decimal] = {}
    for container in pod.get("containers", []):
        res = container.get("resources") or {}
        for key, value in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
            total[key] = total.get(key, Decimal(0)) + parse_quantity(str(value))
    return total


def unfit(pod: Mapping[str, Any], need: Mapping[str, Decimal], node: Mapping[str, Any]) -> str | None:
    """Why the node cannot hold the pod, or None: its nodeSelector, required node affinity, taints, cordon and
    allocatable resources (pods already there are not subtracted: "can ever fit", not "fits now")."""
    name, labels = node["metadata"]["name"], node["metadata"].get("labels") or {}
    if wrong := [f"{k}={v}" for k, v in (pod.get("nodeSelector") or {}).items() if labels.get(k) != v]:
        return f"{name} lacks label {wrong[0]}"
    if not affinity_allows(pod, labels):
        return f"{name} fails the required node affinity"
    if node.get("spec", {}).get("unschedulable"):
        return f"{name} is cordoned"
    for taint in node.get("spec", {}).get("taints") or []:
        if taint["key"].startswith(CONDITION_TAINTS):  # the node's state now (not-ready...), not its purpose
            continue
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerated(taint, pod.get("tolerations") or []):
            return f"{name} has taint {taint['key']}:{taint['effect']} that the pod does not tolerate"
    allocatable = node.get("status", {}).get("allocatable") or {}
    for key, amount in sorted(need.items()):
        try:
            have = parse_quantity(str(allocatable.get(key, "0")))
        except QuantityError:
            have = Decimal(0)
        if amount > have:
            return f"{name} has {key} {format_quantity(have)} allocatable"
    return None


def tolerated(taint: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists" and (not tol.get("key") or tol["key"] == taint.get("key")):
            return True
        if tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def affinity_allows(pod: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Some term of requiredDuringSchedulingIgnoredDuringExecution matches (In, NotIn, Exists, DoesNotExist)."""
    required = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    tests = {"In": lambda e: labels.get(e["key"]) in e.get("values", []),
             "NotIn": lambda e: labels.get(e["key"]) not in e.get("values", []),
             "Exists": lambda e: e["key"] in labels, "DoesNotExist": lambda e: e["key"] not in labels}
    return any(all(tests.get(e["operator"], lambda _: True)(e) for e in term.get("matchExpressions", []))
               for term in required.get("nodeSelectorTerms", []))


def queue_problems(job: RLTrainingJob, facts: Facts) -> Iterator[str]:
    queue = (job.metadata.labels or {}).get(QUEUE_LABEL)
    if not queue or "Kueue's CRDs" in facts.unreadable or "the LocalQueue" in facts.unreadable:
        return
    if not facts.kueue_installed:
        yield (f"metadata.labels.{QUEUE_LABEL}: Kueue is not installed in this cluster: remove the label, or install "
               f"Kueue")
    elif facts.local_queue is None:
        yield (f"metadata.labels.{QUEUE_LABEL}: LocalQueue {queue} does not exist in namespace {facts.namespace}: "
               f"name one that does (kubectl get localqueues)")


def device_class_problems(facts: Facts) -> Iterator[str]:
    for name, exists in sorted(facts.device_classes.items()):
        if not exists and f"DeviceClass {name}" not in facts.unreadable:
            yield (f"spec.placement.deviceClass: DeviceClass {name} does not exist (placement.mode dra): name "
                   f"one the cluster's DRA driver publishes (kubectl get deviceclasses)")


def claim_problems(job: RLTrainingJob, facts: Facts) -> Iterator[str]:
    claim = job.spec.trainer.checkpoint.volume_claim
    if not claim or f"PersistentVolumeClaim {claim}" in facts.unreadable:
        return
    if facts.claim is None:
        yield (f"spec.trainer.checkpoint.volumeClaim: PersistentVolumeClaim {claim} does not exist in namespace "
               f"{facts.namespace}: create it (ReadWriteMany)")
    elif "ReadWriteMany" not in (facts.claim.get("spec") or {}).get("accessModes", []):
        modes = ", ".join(facts.claim["spec"].get("accessModes", []))
        yield (f"spec.trainer.checkpoint.volumeClaim: PersistentVolumeClaim {claim} is {modes}, but the driver and "
               f"every role's pods mount it from several nodes: use a ReadWriteMany claim")


def summary(facts: Facts) -> str:
    """What was found, on one line: the versions of what is installed."""
    leases = [lease for lease in facts.leases if renewed_within(lease, facts.now)]
    operators = ", ".join(
        f"{(lease['metadata'].get('annotations') or {}).get('kuberl.io/operator-version', '?')} "
        f"({lease['metadata']['namespace']}/{lease['metadata']['name']})" for lease in leases) or "unknown"
    crd = ",".join(v["name"] for v in facts.crd["spec"]["versions"] if v.get("served")) if facts.crd else "none"
    return (f"CRD {GROUP} {crd} ({API_VERSION} expected), operator {operators}, KubeRay CRD "
            f"{'ray.io/v1' if facts.kuberay_crd else 'none'}, {len(facts.nodes)} nodes")


def notes(facts: Facts) -> list[str]:
    """What could not be checked, and why (reads the caller may not make)."""
    return [f"not checked: {what} could not be read ({why})" for what, why in sorted(facts.unreadable.items())]


def check(job: RLTrainingJob, manifest: Mapping[str, Any], namespace: str, kubeconfig: str | None) -> int:
    """`kuberl validate --cluster`: print each problem (and what could not be read), or a summary; the exit code."""
    from . import sync_client

    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig
    try:
        facts = read(job, manifest, namespace, sync_client.request)
    except OSError as exc:
        print(f"error: cluster: cannot reach the Kubernetes API ({exc}): check --kubeconfig or $KUBECONFIG",
              file=sys.stderr)
        return 1
    except kopf.LoginError as exc:  # no kubeconfig, no service account
        print(f"error: cluster: {exc}: give --kubeconfig or set $KUBECONFIG", file=sys.stderr)
        return 1
    if any(why.startswith("401") for why in facts.unreadable.values()):
        print("error: cluster: the API server refused these credentials (401): log in again, or give --kubeconfig",
              file=sys.stderr)
        return 1
    found = problems(job, facts)
    for note in notes(facts):
        print(f"note: cluster: {note}", file=sys.stderr)
    for problem in found:
        print(f"error: cluster: {problem}", file=sys.stderr)
    if not found:
        print(f"cluster: namespace {namespace} can run it: {summary(facts)}")
    return 1 if found else 0

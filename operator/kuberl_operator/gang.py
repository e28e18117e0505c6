"""Gang scheduling: all of a job's pods are scheduled together, or none are.

Every pod of a job (the Ray head, each role's workers, the driver) is made with the scheduling gate ``GATE``, so
the scheduler leaves it alone. The operator lifts the gates of all of them at once, and only when the whole set
fits the nodes' free capacity now (`fit`); until then the job waits whole, holding no node's resources, and
its status says why. Once a job holds its pods, a pod made later (a role's restart, a new standby, a scaled
group, a retried driver) is let through at once: the job already runs, and waits only for that pod's node.

Pure: the reconciler lists the pods and nodes and lifts the gates (``reconcile.gang_pass``). The fit is a
simulation of the scheduler's filters that decide here: nodeSelector, required node affinity, taints, cordons
and resource requests against what the pods bound to each Ready node already request (job pods whose room is
spoken for, `reserved`, are placed first). It does not model pod (anti-)affinity, topology spread or DRA claims
(docs/operator.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kuberl.spec.quantity import QuantityError, format_quantity, parse_quantity

from . import names
from .cluster_check import pod_requests, unfit

GATE = names.GANG_GATE
TERMINAL = ("Succeeded", "Failed")
Need = dict[str, Decimal]


def gated(pod: Mapping[str, Any]) -> bool:
    """The pod still carries our gate."""
    return any(g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def live(pod: Mapping[str, Any]) -> bool:
    """Neither finished nor being deleted: it holds (or will hold) a node's resources."""
    return (pod.get("status") or {}).get("phase") not in TERMINAL and not pod["metadata"].get("deletionTimestamp")


def requests(spec: Mapping[str, Any]) -> Need:
    """What a pod spec requests of a node, as the scheduler counts it: its containers and sidecars (init containers
    that keep running), or its largest other init container if that is more; its overhead; and one pod."""
    inits = spec.get("initContainers") or []
    sidecars = [c for c in inits if c.get("restartPolicy") == "Always"]
    total = pod_requests({"containers": [*spec.get("containers", []), *sidecars]})
    for init in (c for c in inits if c.get("restartPolicy") != "Always"):
        for key, amount in pod_requests({"containers": [init]}).items():
            total[key] = max(total.get(key, Decimal(0)), amount)
    for key, value in (spec.get("overhead") or {}).items():
        total[key] = total.get(key, Decimal(0)) + parse_quantity(str(value))
    total["pods"] = total.get("pods", Decimal(0)) + 1
    return total


def allocatable(node: Mapping[str, Any]) -> Need:
    out: Need = {}
    for key, value in ((node.get("status") or {}).get("allocatable") or {}).items():
        try:
            out[key] = parse_quantity(str(value))
        except QuantityError:
            out[key] = Decimal(0)
    return out


def free_capacity(nodes: Sequence[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> dict[str, Need]:
    """Node name -> its allocatable less what the live pods bound to it request."""
    free = {n["metadata"]["name"]: allocatable(n) for n in nodes}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node in free and (pod.get("status") or {}).get("phase") not in TERMINAL:
            for key, amount in requests(pod["spec"]).items():
                free[node][key] = free[node].get(key, Decimal(0)) - amount
    return free


def job_of(pod: Mapping[str, Any]) -> str | None:
    return (pod["metadata"].get("labels") or {}).get(names.LABEL_JOB)


def ray_pod(pod: Mapping[str, Any]) -> bool:
    """A job's Ray pod (its head or a worker): made by its RayCluster, not merely labelled for the job."""
    return any(o.get("kind") == "RayCluster" for o in pod["metadata"].get("ownerReferences") or [])


def ours(pod: Mapping[str, Any]) -> bool:
    """A pod a job's RayCluster or driver Job made (a pod someone else labels for the job is not one of them)."""
    return any(o.get("kind") in ("RayCluster", "Job") for o in pod["metadata"].get("ownerReferences") or [])


def holding_jobs(pods: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """(namespace, job) of each job some live Ray pod of which is past its gate: a job that runs."""
    return {(p["metadata"].get("namespace", ""), job_of(p) or "") for p in pods
            if job_of(p) and ray_pod(p) and live(p) and not gated(p)}


def reserved(pods: Sequence[Mapping[str, Any]], but: tuple[str, str]) -> list[Mapping[str, Any]]:
    """Job pods not bound yet whose room is spoken for (but ``but``'s): let through and about to be placed, or gated
    in a job that runs (its restarted pods, let through as soon as they are seen)."""
    running = holding_jobs(pods)
    out = []
    for p in pods:
        key = (p["metadata"].get("namespace", ""), job_of(p) or "")
        if not job_of(p) or key == but or not live(p) or (p.get("spec") or {}).get("nodeName"):
            continue
        if not (p.get("spec") or {}).get("schedulingGates") or (gated(p) and key in running):
            out.append(p)
    return out


def ready(node: Mapping[str, Any]) -> bool:
    """The node's Ready condition is True (a NotReady node has room on paper only)."""
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def _room(need: Need, name: str, free: Need) -> str | None:
    """Why a node (that the pod's selectors and tolerations allow) has no room for it now, or None."""
    for key, amount in sorted(need.items()):
        if amount > free.get(key, Decimal(0)):
            return f"{name} has {key} {format_quantity(max(free.get(key, Decimal(0)), Decimal(0)))} free"
    return None


def _place(spec: Mapping[str, Any], need: Need, nodes: Sequence[Mapping[str, Any]],
           free: dict[str, Need], now: bool = True) -> str | None:
    """Put the pod on the fitting node with the least room left (packing, so that big pods find whole nodes);
    None when placed, else why no node takes it: the room on those it may use, and how many it may not. ``now``:
    only Ready nodes count (else: whether the node could ever take it)."""
    allowed = [n["metadata"]["name"] for n in nodes if unfit(spec, {}, n) is None and (ready(n) or not now)]
    rooms = {n: _room(need, n, free[n]) for n in allowed}  # why each has no room now, or None
    full = [why for why in rooms.values() if why]
    fits = [n for n, why in rooms.items() if why is None]
    if not fits:
        others = len(nodes) - len(allowed)
        rest = f"{others} other node{'s' if others != 1 else ''} not ready or ruled out by its selectors or tolerations"
        return "; ".join([*full[:3], *([rest] if others else [])]) or "the cluster has no nodes"
    best = min(fits, key=lambda n: tuple(free[n].get(k, Decimal(0)) - need.get(k, Decimal(0))
                                         for k in ("nvidia.com/gpu", "cpu", "memory")))
    for key, amount in need.items():
        free[best][key] = free[best].get(key, Decimal(0)) - amount
    return None


def _size(need: Need) -> tuple[Decimal, ...]:
    return tuple(need.get(k, Decimal(0)) for k in ("nvidia.com/gpu", "cpu", "memory"))


@dataclass(frozen=True)
class Verdict:
    """What to do with a job's gated pods: lift their gates (``release``), or wait and say why (``wait``)."""

    release: tuple[str, ...] = ()
    wait: str | None = None


def gated_names(pods: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The live gated pods' names, the driver's last (were its release to fail half-way, the Ray pods go first: a
    driver let through alone would hold a node and wait for a head that is not there)."""
    members = [p for p in pods if live(p) and gated(p) and ours(p)]
    return tuple(p["metadata"]["name"] for p in sorted(members, key=lambda p: (not ray_pod(p), p["metadata"]["name"])))


def quick(job_pods: Sequence[Mapping[str, Any]], expected: int) -> Verdict | None:
    """The decision that needs no look at the nodes, or None. Nothing gated: nothing to do. A Ray pod of the job
    (its head or a worker) is past its gate already: the job runs, let the new ones through (a role's restart, a
    standby, a scaled group, a retried driver). Not all ``expected`` pods made yet: wait for the rest, quietly
    (KubeRay and the Job controller make them within moments). A driver left running alone (its Ray pods gone:
    Kueue took the job back) holds no Ray pods, so the Ray pods made again are weighed whole."""
    gates = gated_names(job_pods)
    if not gates:
        return Verdict()
    made = [p for p in job_pods if live(p) and ours(p)]
    if any(ray_pod(p) and not gated(p) for p in made):
        return Verdict(release=gates)
    if len(made) < expected:
        return Verdict()
    return None


def fit(job_pods: Sequence[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]],
        cluster_pods: Sequence[Mapping[str, Any]]) -> Verdict:
    """Whether the job's gated pods all fit ``nodes`` now, where ``cluster_pods`` (every live pod of the cluster)
    already run or wait to be placed: release them all, or say which pod fits nowhere and why. A set that no node
    could ever take, even with every node empty, is no reason to wait: it goes through, and the scheduler's words
    reach the job's status (RoleUnschedulable)."""
    gates = gated_names(job_pods)
    needs = {p["metadata"]["name"]: requests(p["spec"]) for p in job_pods if p["metadata"]["name"] in gates}
    members = sorted((p for p in job_pods if p["metadata"]["name"] in needs),
                     key=lambda p: _size(needs[p["metadata"]["name"]]), reverse=True)
    ordered = sorted(nodes, key=lambda n: n["metadata"]["name"])
    empty = {n["metadata"]["name"]: allocatable(n) for n in ordered}
    if any(_place(p["spec"], needs[p["metadata"]["name"]], ordered, empty, now=False) is not None for p in members):
        return Verdict(release=gates)
    free = free_capacity(nodes, cluster_pods)
    job = (job_pods[0]["metadata"].get("namespace", ""), job_of(job_pods[0]) or "") if job_pods else ("", "")
    for pod in reserved(cluster_pods, job):  # spoken for: theirs first, where they fit
        _place(pod["spec"], requests(pod["spec"]), ordered, free)
    for pod in members:
        need = needs[pod["metadata"]["name"]]
        detail = _place(pod["spec"], need, ordered, free)
        if detail is not None:
            wants = ", ".join(f"{k}={format_quantity(v)}" for k, v in sorted(need.items()) if k != "pods")
            return Verdict(wait=f"all {len(gates)} pods wait to be scheduled together: pod {pod['metadata']['name']} "
                                f"({wants}) fits no node's free capacity now ({detail})")
    return Verdict(release=gates)


def expected_pods(groups: Mapping[str, int]) -> int:
    """The whole set: the Ray head, the worker groups' replicas (by role, as the live RayCluster has them) and the
    driver's pod."""
    return 1 + sum(groups.values()) + 1

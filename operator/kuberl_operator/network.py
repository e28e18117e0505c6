"""A job's NetworkPolicy: who may open a connection to its pods.

Every pod of a job (the Ray head, each role's workers, the driver) carries ``kuberl.io/job=<job>``. The policy
selects those pods and admits, on ingress:
- the job's own pods, on every port: Ray's GCS, raylet, object manager, dashboard and job API, the workers' own
  ports, the collectives between a role's ranks;
- pods in the namespaces named for Prometheus (the chart's ``networkPolicy.metricsNamespaces``), and the address
  blocks named for a Prometheus outside the cluster or on a node's host network (``networkPolicy.metricsCIDRs``),
  on the port named ``metrics`` only: the driver's /metrics and the one KubeRay gives the head and the workers.

Nothing else reaches them: a pod of another job in the same namespace, or any pod of another namespace, cannot
open Ray's ports, where a Ray token alone would stand in its way. Egress is left open (checkpoint storage, a
model hub, the API for the reporter sidecar). A policy only holds where the cluster's network plugin enforces
NetworkPolicy (docs/security.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kuberl.spec import RLTrainingJob

from . import names

METRICS_PORT_NAME = "metrics"  # the driver's container port and KubeRay's on the head and the workers
NAMESPACE_NAME = "kubernetes.io/metadata.name"  # the label the API server puts on every namespace


@dataclass(frozen=True)
class Scrapers:
    """Who may reach the job pods' metrics ports besides the job's own pods (none of either: nobody)."""

    namespaces: tuple[str, ...] = ()  # pods of these namespaces (where Prometheus runs)
    cidrs: tuple[str, ...] = ()  # these address blocks: a Prometheus outside the cluster, or on a host network

    def peers(self) -> list[dict[str, Any]]:
        """The policy's `from` peers for the metrics ports."""
        peers: list[dict[str, Any]] = [{"ipBlock": {"cidr": cidr}} for cidr in sorted(set(self.cidrs))]
        if self.namespaces:
            peers.insert(0, {"namespaceSelector": {"matchExpressions": [
                {"key": NAMESPACE_NAME, "operator": "In", "values": sorted(set(self.namespaces))}]}})
        return peers


def network_policy(job: RLTrainingJob, namespace: str, scrapers: Scrapers) -> dict[str, Any]:
    """The networking.k8s.io/v1 NetworkPolicy ``<job>-network`` of `job` in `namespace`."""
    name = job.metadata.name
    own = {"podSelector": {"matchLabels": {names.LABEL_JOB: name}}}
    ingress: list[dict[str, Any]] = [{"from": [own]}]
    if peers := scrapers.peers():
        ingress.append({"from": peers, "ports": [{"protocol": "TCP", "port": METRICS_PORT_NAME}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": names.network_policy(name), "namespace": namespace,
                     "labels": names.labels(name, "network")},
        "spec": {"podSelector": {"matchLabels": {names.LABEL_JOB: name}}, "policyTypes": ["Ingress"],
                 "ingress": ingress},
    }

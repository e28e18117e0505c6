"""Operator settings: from `kuberl operator` flags, or from the environment under plain `kopf run`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from .builders import DEFAULT_IMAGE, DRIVER_RESOURCES, HEAD_RESOURCES, SCRATCH
from .job_policy import JobPolicy
from .network import Scrapers

DEFAULT_MAX_GPUS_PER_NODE = 8
# Seconds between two creates of a job's Ray token Secret outside its own events (the operator may not read
# Secrets, so a create, 409 while it exists, is how it learns one was deleted): at most one request per job per
# 15 minutes at rest. KUBERL_SECRET_PROBE_SECONDS overrides it (the tests' operator probes at every resync).
SECRET_PROBE_SECONDS = 900.0


# Passes over jobs that run at once (each a few API requests in a row, one job's at a time). When the API server is
# the bottleneck (a burst of new jobs), it answers the operator at a rate of its own, and each request waits for the
# ones the operator has in flight: more passes at once only lengthen every pass, not the burst (docs/performance.md,
# "1,000 jobs at once"). KUBERL_CONCURRENT_PASSES or --concurrent-passes override it.
CONCURRENT_PASSES = 4
# The leader election's Lease (--leader-elect, leader.py): its name in the operator's namespace, and its duration in
# seconds (a dead leader is replaced after at most this and a retry period).
LEASE_NAME = "kuberl-operator"
DEFAULT_LEASE_SECONDS = 15
MIN_LEASE_SECONDS = 6  # a third of it, the leader's margin before a peer may take over, is at least 2 s


def secret_probe_seconds() -> float:
    return float(os.environ.get("KUBERL_SECRET_PROBE_SECONDS", SECRET_PROBE_SECONDS))


@dataclass(frozen=True)
class OperatorConfig:
    image: str = DEFAULT_IMAGE  # the runtime image of Ray pods and the driver, unless a job names its own
    metrics_port: int | None = None  # None: no metrics endpoint
    metrics_address: str = "127.0.0.1"  # the chart passes 0.0.0.0 inside the pod
    max_gpus_per_node: int = DEFAULT_MAX_GPUS_PER_NODE  # the most GPUs any node has: a bigger replica never fits
    head: Mapping[str, str] = field(default_factory=lambda: dict(HEAD_RESOURCES))  # each job's Ray head pod
    driver: Mapping[str, str] = field(default_factory=lambda: dict(DRIVER_RESOURCES))  # each job's driver pod
    cpu_limits: bool = True  # CPU limits equal to the requests (Guaranteed pods); off: requests only
    scratch: Mapping[str, str] = field(default_factory=lambda: dict(SCRATCH))  # the job pods' emptyDir sizeLimits
    job_policy: JobPolicy = field(default_factory=JobPolicy)  # what a job's author may choose (the chart's jobPolicy)
    secret_probe_seconds: float = field(default_factory=secret_probe_seconds)
    concurrent_passes: int = CONCURRENT_PASSES  # passes over jobs running at once (`reconcile.Context.turn`)
    network_policy: bool = True  # each job gets a NetworkPolicy (`network`)
    scrapers: Scrapers = Scrapers()  # who may reach the job pods' metrics ports (Prometheus)
    gang_scheduling: bool = True  # a job's pods are let through to the scheduler together, when all fit (gang.py)

    @classmethod
    def from_env(cls) -> OperatorConfig:
        """KUBERL_RUNTIME_IMAGE, KUBERL_METRICS_PORT, KUBERL_METRICS_ADDRESS, KUBERL_MAX_GPUS_PER_NODE,
        KUBERL_CONCURRENT_PASSES, KUBERL_GANG_SCHEDULING (0: off)."""
        port = os.environ.get("KUBERL_METRICS_PORT")
        gpus = os.environ.get("KUBERL_MAX_GPUS_PER_NODE")
        passes = os.environ.get("KUBERL_CONCURRENT_PASSES")
        return cls(
            image=os.environ.get("KUBERL_RUNTIME_IMAGE", DEFAULT_IMAGE),
            metrics_port=int(port) if port else None,
            metrics_address=os.environ.get("KUBERL_METRICS_ADDRESS", cls.metrics_address),
            max_gpus_per_node=int(gpus) if gpus else DEFAULT_MAX_GPUS_PER_NODE,
            concurrent_passes=int(passes) if passes else CONCURRENT_PASSES,
            gang_scheduling=os.environ.get("KUBERL_GANG_SCHEDULING", "1") != "0",
        )

"""The operator's Prometheus metrics: jobs by phase, per-role replicas, restarts and worst GPU link,
reconciles.

Per-job values are kept from the last status the operator wrote, so they survive nothing but are
rebuilt on the first reconcile after an operator restart. ``job`` clashes with Prometheus' own
target label: scrape with ``honorLabels: true`` (the chart's ServiceMonitor should) or read it as
``exported_job``.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import kopf
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from kuberl.topology.matrix import TopologyError, link_score
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PHASES = ("Pending", "Provisioning", "Running", "Restarting", "Succeeded", "Failed", "Suspended")
ROLE_LABELS = ("namespace", "job", "role")


def valid_link(level: Any) -> bool:
    """A link level the topology module knows (the driver's report is not trusted blindly)."""
    if not isinstance(level, str):
        return False
    try:
        return math.isfinite(link_score(level))  # "X" (a GPU to itself) is no link
    except TopologyError:
        return False


class Metrics:
    """A registry of its own (no process/platform collectors), filled from job statuses."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.ready = Gauge("kuberl_operator_role_ready_replicas", "Ready pods of a role.", ROLE_LABELS, registry=self.registry)
        self.desired = Gauge("kuberl_operator_role_desired_replicas", "Desired pods of a role.", ROLE_LABELS, registry=self.registry)
        self.errors = Counter("kuberl_operator_reconcile_errors", "Reconciles that ended in an error (waits excluded).", registry=self.registry)
        self.duration = Histogram("kuberl_operator_reconcile_duration_seconds", "Time spent in one reconcile.", registry=self.registry)
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, str], str] = {}
        self._restarts: dict[tuple[str, str, str], int] = {}
        self._links: dict[tuple[str, str, str], str] = {}  # status.roles.R.worstLink, as the driver reported it
        self.registry.register(self)

    def collect(self) -> Iterator[Any]:
        """Jobs by phase and restarts per role, computed at scrape time (prometheus_client collector)."""
        with self._lock:
            phases = list(self._phases.values())
            restarts = dict(self._restarts)
            links = dict(self._links)
        jobs = GaugeMetricFamily("kuberl_operator_jobs", "RLTrainingJobs by phase.", labels=["phase"])
        for phase in PHASES:
            jobs.add_metric([phase], phases.count(phase))
        yield jobs
        total = CounterMetricFamily("kuberl_operator_role_restarts", "Restarts of a role (status.roles.R.restarts).", labels=list(ROLE_LABELS))
        for labels, value in sorted(restarts.items()):
            total.add_metric(list(labels), value)
        yield total
        worst = GaugeMetricFamily(
            "kuberl_operator_role_worst_link_score",
            "Score of the worst GPU link inside a role's groups (SYS 1, NODE 2, PHB 3, PXB 4, PIX 5, NV<n> 5+n); "
            "level is the link as nvidia-smi names it.", labels=[*ROLE_LABELS, "level"])
        for labels, level in sorted(links.items()):
            worst.add_metric([*labels, level], link_score(level))
        if links:  # no series (and no family) until some driver has reported a link
            yield worst

    def observe(self, namespace: str, job: str, status: Mapping[str, Any]) -> None:
        """Record a job's status as written."""
        with self._lock:
            if status.get("phase"):
                self._phases[namespace, job] = status["phase"]
            for key in [k for k in self._links if k[:2] == (namespace, job)]:
                del self._links[key]
            for role, rs in (status.get("roles") or {}).items():
                self._restarts[namespace, job, role] = int(rs.get("restarts", 0))
                if valid_link(rs.get("worstLink")):
                    self._links[namespace, job, role] = rs["worstLink"]
        for role, rs in (status.get("roles") or {}).items():
            self.ready.labels(namespace, job, role).set(rs.get("ready", 0))
            self.desired.labels(namespace, job, role).set(rs.get("desired", 0))

    def forget(self, namespace: str, job: str) -> None:
        """Drop a deleted job's series."""
        with self._lock:
            self._phases.pop((namespace, job), None)
            roles = [r for (ns, j, r) in self._restarts if (ns, j) == (namespace, job)]
            for role in roles:
                del self._restarts[namespace, job, role]
            for key in [k for k in self._links if k[:2] == (namespace, job)]:
                del self._links[key]
        for role in roles:
            for gauge in (self.ready, self.desired):
                with contextlib.suppress(KeyError):
                    gauge.remove(namespace, job, role)

    @contextlib.contextmanager
    def reconcile(self) -> Iterator[None]:
        """Time a reconcile; count it as an error unless it ends in success or a deliberate wait."""
        start = time.perf_counter()
        try:
            yield
        except kopf.TemporaryError:
            raise
        except Exception:
            self.errors.inc()
            raise
        finally:
            self.duration.observe(time.perf_counter() - start)

    def serve(self, port: int, address: str) -> Any:
        """Serve /metrics from a thread; returns the server (``shutdown()`` stops it)."""
        server, _ = start_http_server(port, addr=address, registry=self.registry)
        return server

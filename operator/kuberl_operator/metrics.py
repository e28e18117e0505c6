"""The operator's Prometheus metrics: jobs by phase, each job's phase, per-role replicas, restarts,
restart budgets and worst GPU link, reconciles, and the build.

``FAMILIES`` is the one definition of every family (type, help, labels): the registry is built from
it, and docs/metrics.md is generated from it. Per-job values are kept from the last status the
operator wrote, so they survive nothing but are rebuilt on the first reconcile after an operator
restart. ``job`` clashes with Prometheus' own target label: scrape with ``honorLabels: true`` (the
chart's ServiceMonitor does) or read it as ``exported_job``.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import kopf
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kuberl.spec import JobSpec, enabled_roles
from kuberl.topology.matrix import TopologyError, link_score
from kuberl.version import build_labels

PHASES = ("Pending", "Provisioning", "Running", "Restarting", "Succeeded", "Failed", "Suspended")
JOB_LABELS = ("namespace", "job")
ROLE_LABELS = (*JOB_LABELS, "role")

# name as scraped -> (type, help, labels)
FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "kuberl_build_info": ("gauge", "Always 1: the kuberl version this process runs, and which component it is.",
                          ("version", "component")),
    "kuberl_operator_jobs": ("gauge", "RLTrainingJobs by phase.", ("phase",)),
    "kuberl_operator_job_phase": ("gauge", "1 for the job's current phase (status.phase), 0 for every other phase.",
                                  (*JOB_LABELS, "phase")),
    "kuberl_operator_role_ready_replicas": ("gauge", "Ready pods of a role.", ROLE_LABELS),
    "kuberl_operator_role_desired_replicas": ("gauge", "Desired pods of a role.", ROLE_LABELS),
    "kuberl_operator_role_restarts_total": ("counter", "Restarts of a role (status.roles.R.restarts).", ROLE_LABELS),
    "kuberl_operator_role_max_restarts": ("gauge", "A role's restart budget (spec.roles.R.maxRestarts): one more "
                                          "restart than this fails the job.", ROLE_LABELS),
    "kuberl_operator_role_worst_link_score": (
        "gauge", "Score of the worst GPU link inside a role's groups (SYS 1, NODE 2, PHB 3, PXB 4, PIX 5, NV<n> 5+n); "
        "level is the link as nvidia-smi names it.", (*ROLE_LABELS, "level")),
    "kuberl_operator_reconcile_errors_total": ("counter", "Reconciles that ended in an error (waits excluded).", ()),
    "kuberl_operator_reconcile_duration_seconds": ("histogram", "Time spent in one reconcile, from the start of its "
                                                   "turn (the wait for it is the queue's histogram).", ()),
    "kuberl_operator_reconcile_queue_seconds": ("histogram", "Time a reconcile waited for its turn: its job's lock "
                                                "and one of the operator's concurrent passes.", ()),
    "kuberl_operator_api_requests_total": (
        "counter", "Requests this operator sent to the API server (kopf's and its own), by verb and resource as the "
        "audit log names them, and the response's status code.", ("verb", "resource", "code")),
    "kuberl_operator_watch_starts_total": ("counter", "Watches started (the first and every restart), by resource.",
                                           ("resource",)),
    "kuberl_operator_cache_objects": ("gauge", "Objects held in the operator's watch-backed cache, by resource.",
                                      ("resource",)),
    "kuberl_operator_leader": ("gauge", "1 in the replica that holds the leader Lease and acts on jobs (or runs "
                               "without leader election), 0 in a standby waiting to take over.", ()),
}
# Seconds: past prometheus_client's default 10 s, since a pass's requests may queue at a busy API server; 2 s is the
# burst's goal for a pass (docs/performance.md), so the share within it is exact, not interpolated. A burst of new jobs
# queues for the passes' turns for minutes (bench/operator_load.py).
RECONCILE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, float("inf"))
QUEUE_BUCKETS = (*RECONCILE_BUCKETS[:-1], 160.0, 320.0, 640.0, float("inf"))


def valid_link(level: Any) -> bool:
    """A link level the topology module knows (the driver's report is not trusted blindly)."""
    if not isinstance(level, str):
        return False
    try:
        return math.isfinite(link_score(level))  # "X" (a GPU to itself) is no link
    except TopologyError:
        return False


def restart_budgets(spec: JobSpec) -> dict[str, int]:
    """role -> spec.roles.<role>.maxRestarts, for the roles the job runs."""
    return {role: spec.roles.get(role).max_restarts for role in enabled_roles(spec)}


def _family(name: str) -> GaugeMetricFamily | CounterMetricFamily:
    kind, help_text, labels = FAMILIES[name]
    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    return cls(name, help_text, labels=list(labels))


class Metrics:
    """A registry of its own (no process/platform collectors), filled from job statuses."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.errors = Counter("kuberl_operator_reconcile_errors", FAMILIES["kuberl_operator_reconcile_errors_total"][1],
                              registry=self.registry)
        self.duration = Histogram("kuberl_operator_reconcile_duration_seconds",
                                  FAMILIES["kuberl_operator_reconcile_duration_seconds"][1], buckets=RECONCILE_BUCKETS,
                                  registry=self.registry)
        self.queued = Histogram("kuberl_operator_reconcile_queue_seconds",
                                FAMILIES["kuberl_operator_reconcile_queue_seconds"][1], buckets=QUEUE_BUCKETS,
                                registry=self.registry)
        self.requests = Counter("kuberl_operator_api_requests", FAMILIES["kuberl_operator_api_requests_total"][1],
                                FAMILIES["kuberl_operator_api_requests_total"][2], registry=self.registry)
        self.watches = Counter("kuberl_operator_watch_starts", FAMILIES["kuberl_operator_watch_starts_total"][1],
                               FAMILIES["kuberl_operator_watch_starts_total"][2], registry=self.registry)
        self.cache_sizes: Callable[[], Mapping[str, int]] = dict  # resource -> objects cached (set by the handlers)
        self.leading = True  # False while a standby waits for the leader Lease (leader.py)
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, str], str] = {}
        self._roles: dict[tuple[str, str, str], Mapping[str, Any]] = {}  # status.roles.R as written
        self._budgets: dict[tuple[str, str, str], int] = {}
        self.registry.register(self)

    def collect(self) -> Iterator[Any]:
        """Every family but the counters and the histogram, computed at scrape time (a collector)."""
        with self._lock:
            phases = dict(self._phases)
            roles = dict(self._roles)
            budgets = dict(self._budgets)
        info = _family("kuberl_build_info")
        labels = build_labels("operator")
        info.add_metric([labels[k] for k in FAMILIES["kuberl_build_info"][2]], 1.0)
        yield info
        jobs, job_phase = _family("kuberl_operator_jobs"), _family("kuberl_operator_job_phase")
        for phase in PHASES:
            jobs.add_metric([phase], list(phases.values()).count(phase))
        for (ns, job), current in sorted(phases.items()):
            for phase in PHASES:
                job_phase.add_metric([ns, job, phase], 1.0 if phase == current else 0.0)
        yield jobs
        yield job_phase
        ready = _family("kuberl_operator_role_ready_replicas")
        desired = _family("kuberl_operator_role_desired_replicas")
        restarts = _family("kuberl_operator_role_restarts_total")
        worst = _family("kuberl_operator_role_worst_link_score")
        for key, rs in sorted(roles.items()):
            ready.add_metric(list(key), float(rs.get("ready", 0)))
            desired.add_metric(list(key), float(rs.get("desired", 0)))
            restarts.add_metric(list(key), float(rs.get("restarts", 0)))
            if valid_link(rs.get("worstLink")):
                worst.add_metric([*key, rs["worstLink"]], link_score(rs["worstLink"]))
        yield from (ready, desired, restarts)
        budget = _family("kuberl_operator_role_max_restarts")
        for key, value in sorted(budgets.items()):
            budget.add_metric(list(key), float(value))
        yield budget
        if worst.samples:  # no series (and no family) until some driver has reported a link
            yield worst
        cached = _family("kuberl_operator_cache_objects")
        for resource, count in sorted(self.cache_sizes().items()):
            cached.add_metric([resource], float(count))
        yield cached
        leader = _family("kuberl_operator_leader")
        leader.add_metric([], 1.0 if self.leading else 0.0)
        yield leader

    def request(self, verb: str, resource: str, code: int) -> None:
        """Count one API request (`api_traffic.trace_config`'s callback); a watch also counts as a watch start."""
        self.requests.labels(verb, resource, str(code)).inc()
        if verb == "watch":
            self.watches.labels(resource).inc()

    def observe(self, namespace: str, job: str, status: Mapping[str, Any], spec: JobSpec | None = None) -> None:
        """Record a job's status as written (and, given its spec, the roles' restart budgets)."""
        with self._lock:
            if status.get("phase"):
                self._phases[namespace, job] = status["phase"]
            if "roles" in status:
                self._drop(self._roles, namespace, job)
                for role, rs in (status.get("roles") or {}).items():
                    self._roles[namespace, job, role] = dict(rs)
            if spec is not None:
                self._drop(self._budgets, namespace, job)
                for role, value in restart_budgets(spec).items():
                    self._budgets[namespace, job, role] = value

    def forget(self, namespace: str, job: str) -> None:
        """Drop a deleted job's series."""
        with self._lock:
            self._phases.pop((namespace, job), None)
            self._drop(self._roles, namespace, job)
            self._drop(self._budgets, namespace, job)

    @staticmethod
    def _drop(table: dict[tuple[str, str, str], Any], namespace: str, job: str) -> None:
        for key in [k for k in table if k[:2] == (namespace, job)]:
            del table[key]

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

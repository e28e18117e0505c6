"""Prometheus gauges from step records, on a registry and HTTP server of their own.

Families are fixed (`PROM_FAMILIES`): phases, roles and recovery parts are labels, so dashboards
query a known set of names.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from kuberl.metrics.record import RECOVERY_PARTS, StepRecord

# family -> (help, labels besides `job`); every family is a gauge unless PROM_COUNTERS names it.
PROM_FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "kuberl_build_info": ("Always 1: the kuberl version this process runs, and which component it is.",
                          ("version", "component")),
    "kuberl_step": ("Last completed training step.", ()),
    "kuberl_last_step_timestamp_seconds": ("Unix time at which the last step completed.", ()),
    "kuberl_reward_mean": ("Mean sequence reward of the step's rollouts.", ()),
    "kuberl_kl": ("Mean per-token KL(actor || ref) of the rollouts.", ()),
    "kuberl_kl_coef": ("Current KL coefficient.", ()),
    "kuberl_entropy": ("Mean per-token policy entropy (nats).", ()),
    "kuberl_clipped_tokens_ratio": ("Fraction of tokens whose policy ratio was clipped.", ()),
    "kuberl_response_length_tokens": ("Mean response length of the step's rollouts, in tokens.", ()),
    "kuberl_rollout_tokens_per_second": ("Generated tokens per second of generation time.", ()),
    "kuberl_train_tokens_per_second": ("Actor training tokens per second of update time.", ()),
    "kuberl_mfu_ratio": ("Actor update model-FLOPs utilisation (6·N·tokens / measured peak).", ()),
    "kuberl_rollout_staleness_steps": ("Updates between the weights that generated the last step's batch and the "
                                       "weights it updated: 0 on-policy, 1 with spec.rollout.asynchronous, the "
                                       "largest of its samples' with spec.rollout.async.", ()),
    "kuberl_env_turns_per_trajectory": ("Policy turns per trajectory of the last step (spec.environment), of the "
                                        "trajectories that did not fail.", ()),
    "kuberl_env_failed_trajectories": ("Trajectories of the last step whose environment failed (raised, timed out "
                                       "or answered nonsense); left out of the update.", ()),
    "kuberl_env_tool_calls": ("Tool calls of the last step's trajectories, as their environments counted them.", ()),
    "kuberl_env_tool_errors": ("Tool calls of the last step that came back as an error.", ()),
    "kuberl_env_seconds": ("Seconds the last step's rollout waited for environment calls (the longest of the "
                           "actor's ranks).", ()),
    "kuberl_phase_seconds": ("Seconds spent in a phase of the last step.", ("phase",)),
    "kuberl_role_group_restarts_total": ("Restarts of a role's WorkerGroup since the job began.", ("role",)),
    "kuberl_recovery_seconds": ("Seconds of a role's recoveries in the last step that had one, by part "
                                "(detect, ready, replay, total).", ("role", "part")),
    "kuberl_steps_lost": ("Training steps of a role's state lost in its last recovery.", ("role",)),
    "kuberl_role_worst_link_score": ("Link score of the worst GPU link inside a role's groups "
                                     "(NV#=5+n, PIX 5, PXB 4, PHB 3, NODE 2, SYS 1); source: where the links were "
                                     "read (nvml, nvidia-smi).", ("role", "level", "source")),
    "kuberl_role_memory_bytes": ("Peak memory of a role's rank 0, by kind (gpu_peak, rss_peak).", ("role", "kind")),
}
PROM_COUNTERS = frozenset({"kuberl_role_group_restarts_total"})
# Renamed families: old name -> new name. The old name is still served, as a gauge with the same
# series, until the release named here; docs/metrics.md lists them.
PROM_ALIASES: dict[str, str] = {
    "kuberl_clip_frac": "kuberl_clipped_tokens_ratio",
    "kuberl_response_length_mean": "kuberl_response_length_tokens",
    "kuberl_role_restarts": "kuberl_role_group_restarts_total",
}
ALIASES_REMOVED_IN = "0.2.0"
_FIELDS = {"reward_mean": "kuberl_reward_mean", "response_length_mean": "kuberl_response_length_tokens",
           "rollout_tokens_per_s": "kuberl_rollout_tokens_per_second",
           "train_tokens_per_s": "kuberl_train_tokens_per_second", "mfu": "kuberl_mfu_ratio",
           "staleness": "kuberl_rollout_staleness_steps"}
_STATS = {"kl": "kuberl_kl", "kl_coef": "kuberl_kl_coef", "entropy": "kuberl_entropy",
          "clip_frac": "kuberl_clipped_tokens_ratio", "env_turns_mean": "kuberl_env_turns_per_trajectory",
          "env_failed": "kuberl_env_failed_trajectories", "env_tool_calls": "kuberl_env_tool_calls",
          "env_tool_errors": "kuberl_env_tool_errors", "env_seconds": "kuberl_env_seconds"}

Sample = tuple[str, dict[str, str], float]


def prom_samples(rec: StepRecord) -> list[Sample]:
    """(family, labels, value) for what a step record holds; non-finite values are left out."""
    out: list[Sample] = [("kuberl_step", {}, float(rec.step))]
    out += [(family, {}, getattr(rec, key)) for key, family in _FIELDS.items()]
    out += [(family, {}, rec.stats[key]) for key, family in _STATS.items() if key in rec.stats]
    out += [("kuberl_phase_seconds", {"phase": phase}, s) for phase, s in rec.phases.items()]
    out.append(("kuberl_phase_seconds", {"phase": "step"}, rec.step_s))
    for role, rs in rec.roles.items():
        out.append(("kuberl_role_group_restarts_total", {"role": role}, rs.restarts))
        out += [("kuberl_role_memory_bytes", {"role": role, "kind": kind}, v) for kind, v in rs.memory.items()]
        if rs.recoveries:
            out += [("kuberl_recovery_seconds", {"role": role, "part": part}, rs.recovery_seconds(part))
                    for part in RECOVERY_PARTS]
            out.append(("kuberl_steps_lost", {"role": role}, rs.steps_lost))
        if rs.worst_link and rs.worst_link != "unknown":
            from kuberl.topology import link_score

            labels = {"role": role, "level": rs.worst_link, "source": rs.topology_source or "none"}
            out.append(("kuberl_role_worst_link_score", labels, link_score(rs.worst_link)))
    return [(f, labels, float(v)) for f, labels, v in out if _finite(v)]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class PromSeries:
    """The last value of every (family, labels) set, served with its family's type, and under each
    deprecated alias of the family too (a prometheus_client collector)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[str, ...], float]] = {}

    def set(self, family: str, labels: dict[str, str], value: float) -> None:
        """labels: `job` and the family's own labels (PROM_FAMILIES)."""
        names = ("job", *PROM_FAMILIES[family][1])
        with self._lock:
            self._values.setdefault(family, {})[tuple(labels[n] for n in names)] = value

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            values = {family: dict(series) for family, series in self._values.items()}
        aliases = {new: old for old, new in PROM_ALIASES.items()}
        for family, series in values.items():
            help_text, labels = PROM_FAMILIES[family]
            kinds = [(family, CounterMetricFamily if family in PROM_COUNTERS else GaugeMetricFamily, help_text)]
            if family in aliases:
                kinds.append((aliases[family], GaugeMetricFamily,
                              f"Deprecated: renamed {family}, this name goes in {ALIASES_REMOVED_IN}. {help_text}"))
            for name, cls, text in kinds:
                metric = cls(name, text, labels=["job", *labels])
                for key, value in sorted(series.items()):
                    metric.add_metric(list(key), value)
                yield metric


class PrometheusExporter:
    """Serves the last step's samples on `address:port` (0: any free port; `.port` says which), with
    `kuberl_build_info` and the time the last step completed."""

    def __init__(self, job: str, port: int, address: str = "127.0.0.1"):
        from prometheus_client import CollectorRegistry, start_http_server

        from kuberl.version import build_labels

        self.job = job
        self.registry = CollectorRegistry()
        self.series = PromSeries()
        self.registry.register(self.series)
        self.series.set("kuberl_build_info", {"job": job, **build_labels("driver")}, 1.0)
        self.server, _ = start_http_server(port, addr=address, registry=self.registry)
        self.port: int = self.server.server_address[1]

    def write(self, rec: StepRecord) -> None:
        for family, labels, value in prom_samples(rec):
            self.series.set(family, {"job": self.job, **labels}, value)
        self.series.set("kuberl_last_step_timestamp_seconds", {"job": self.job}, time.time())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(job: str, port: int | None, address: str) -> PrometheusExporter | None:
    return PrometheusExporter(job, port, address) if port is not None else None

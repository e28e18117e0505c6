"""Per-step metrics, each sink written from the typed `kuberl.metrics.record.StepRecord`: `metrics.jsonl`,
Prometheus, a progress bar (or log lines), the reward-curve PNG and the timeline PNG."""

from .flops import mfu
from .jsonl import JsonlWriter, last_step, read_jsonl
from .plot import plot_reward_curve, plot_timeline
from .prometheus import (
    ALIASES_REMOVED_IN,
    PROM_ALIASES,
    PROM_COUNTERS,
    PROM_FAMILIES,
    PrometheusExporter,
    PromSeries,
    prom_samples,
)
from .sink import MetricsSink, StepWriter

__all__ = [
    "ALIASES_REMOVED_IN", "PROM_ALIASES", "PROM_COUNTERS", "PROM_FAMILIES", "JsonlWriter", "MetricsSink",
    "PromSeries", "PrometheusExporter", "StepWriter", "last_step", "mfu", "plot_reward_curve", "plot_timeline",
    "prom_samples", "read_jsonl",
]

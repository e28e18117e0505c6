"""Per-step metrics: a progress bar (or log lines), `metrics.jsonl`, Prometheus, and a reward-curve PNG.

Metric keys are flat snake_case. Prometheus families are fixed (see `PROM_FAMILIES`): per-phase,
per-role and per-recovery keys become labels, so dashboards query a known set of names.
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional, Sequence

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
    "kuberl_phase_seconds": ("Seconds spent in a phase of the last step.", ("phase",)),
    "kuberl_role_group_restarts_total": ("Restarts of a role's WorkerGroup since the job began.", ("role",)),
    "kuberl_recovery_seconds": ("Seconds of the last recovery of a role, by part (detect, ready, replay, total).",
                                ("role", "part")),
    "kuberl_steps_lost": ("Training steps of a role's state lost in its last recovery.", ("role",)),
    "kuberl_role_worst_link_score": ("Link score of the worst GPU link inside a role's groups "
                                     "(NV#=5+n, PIX 5, PXB 4, PHB 3, NODE 2, SYS 1); "
                                     "source: where the links were read (nvml, nvidia-smi).",
                                     ("role", "level", "source")),
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
_PLAIN = {"step": "kuberl_step", "reward_mean": "kuberl_reward_mean", "kl": "kuberl_kl", "kl_coef": "kuberl_kl_coef",
          "entropy": "kuberl_entropy", "clip_frac": "kuberl_clipped_tokens_ratio",
          "response_length_mean": "kuberl_response_length_tokens",
          "rollout_tokens_per_s": "kuberl_rollout_tokens_per_second",
          "train_tokens_per_s": "kuberl_train_tokens_per_second",
          "mfu": "kuberl_mfu_ratio"}
_PATTERNS = [
    (re.compile(r"^time_(?P<phase>\w+?)_s$"), "kuberl_phase_seconds"),
    (re.compile(r"^restarts_(?P<role>\w+)$"), "kuberl_role_group_restarts_total"),
    (re.compile(r"^recovery_(?P<role>[a-z]+)_(?P<part>\w+?)_s$"), "kuberl_recovery_seconds"),
    (re.compile(r"^steps_lost_(?P<role>\w+)$"), "kuberl_steps_lost"),
    (re.compile(r"^memory_(?P<role>[a-z]+)_(?P<kind>\w+?)_bytes$"), "kuberl_role_memory_bytes"),
]


def prom_samples(record: dict[str, Any]) -> list[tuple[str, dict[str, str], float]]:
    """(family, labels, value) for each key of a step record that has a Prometheus family."""
    out = []
    for key, value in record.items():
        if key.startswith("worst_link_") and isinstance(value, str) and value != "unknown":
            from .topology import link_score

            role = key[len("worst_link_"):]
            labels = {"role": role, "level": value, "source": str(record.get(f"topology_source_{role}", "none"))}
            out.append(("kuberl_role_worst_link_score", labels, link_score(value)))
            continue
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        if key in _PLAIN:
            out.append((_PLAIN[key], {}, float(value)))
            continue
        for pattern, family in _PATTERNS:
            m = pattern.match(key)
            if m:
                out.append((family, m.groupdict(), float(value)))
                break
    return out


class PromSeries:
    """The last value of every (family, labels) the sink has set, served with its family's type, and
    under each deprecated alias of the family too (a prometheus_client collector)."""

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


PROGRESS_KEYS = (("reward_mean", "reward"), ("kl", "kl"), ("rollout_tokens_per_s", "tok/s"))


def mfu(n_params: int, tokens: float, seconds: float, peak_flops: float, devices: int = 1) -> float:
    """Model FLOPs utilisation: 6·N·tokens / (seconds · peak · devices). N excludes embeddings."""
    if seconds <= 0 or peak_flops <= 0:
        return 0.0
    return 6.0 * n_params * tokens / (seconds * peak_flops * devices)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsSink:
    def __init__(self, out_dir: Path, job: str, total_steps: int, start_step: int = 0, progress: bool = True,
                 prometheus_port: Optional[int] = None, prometheus_address: str = "127.0.0.1",
                 trackers: Sequence[Any] = ()):
        """`trackers`: kuberl.tracking sinks (TensorBoard, MLflow, W&B), each given every record too."""
        self.path = out_dir / "metrics.jsonl"
        self.trackers = list(trackers)
        self.job, self.total = job, total_steps
        self._truncate_after(start_step)
        self.bar = None
        if progress and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, desc=job, unit="step", dynamic_ncols=True)
        self.registry = None
        self.port: Optional[int] = None
        if prometheus_port is not None:
            self._serve(prometheus_port, prometheus_address)

    def _truncate_after(self, step: int) -> None:
        """On resume keep one continuous file: drop records past the restored step."""
        kept = [r for r in read_jsonl(self.path) if r.get("step", 0) <= step]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def _serve(self, port: int, address: str) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        from .version import build_labels

        self.registry = CollectorRegistry()
        self.series = PromSeries()
        self.registry.register(self.series)
        self.series.set("kuberl_build_info", {"job": self.job, **build_labels("driver")}, 1.0)
        server, _ = start_http_server(port, addr=address, registry=self.registry)
        self.server = server
        self.port = server.server_address[1]

    def log(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        for tracker in self.trackers:
            tracker.log(record)
        if self.registry is not None:
            for family, labels, value in prom_samples(record):
                self.series.set(family, {"job": self.job, **labels}, value)
            self.series.set("kuberl_last_step_timestamp_seconds", {"job": self.job}, time.time())
        shown = {label: record[k] for k, label in PROGRESS_KEYS if k in record}
        if self.bar is not None:
            self.bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()}, refresh=False)
            self.bar.update(1)
        else:
            parts = " ".join(f"{k}={v:.4g}" for k, v in shown.items())
            print(f"[{self.job}] step {record['step']}/{self.total} {parts} step_s={record.get('time_step_s', 0):.2f}", flush=True)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        if self.bar is not None:
            self.bar.close()
        if self.registry is not None:
            self.server.shutdown()
            self.server.server_close()


def plot_reward_curve(jsonl: Path, png: Path, key: str = "reward_mean") -> Path:
    """Write the reward curve (and a 10-step moving average) of a metrics.jsonl to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_jsonl(jsonl) if key in r]
    steps, values = [r["step"] for r in rows], [r[key] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(steps, values, lw=1, alpha=0.5, label=key)
    if len(values) >= 10:
        avg = [sum(values[max(0, i - 9) : i + 1]) / len(values[max(0, i - 9) : i + 1]) for i in range(len(values))]
        ax.plot(steps, avg, lw=2, label="10-step mean")
    evals = [r for r in read_jsonl(jsonl) if "eval_reward_mean" in r]
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval_reward_mean"] for r in evals], "o-", lw=1.5, label="eval (greedy)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(jsonl.parent.name)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png

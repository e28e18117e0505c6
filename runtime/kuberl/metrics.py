"""Per-step metrics: a progress bar (or log lines), `metrics.jsonl`, Prometheus, and a reward-curve PNG.

Metric keys are flat snake_case; Prometheus names are `kuberl_<key>` (gauges), labelled by job.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Optional

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
                 prometheus_port: Optional[int] = None, prometheus_address: str = "127.0.0.1"):
        self.path = out_dir / "metrics.jsonl"
        self.job, self.total = job, total_steps
        self._truncate_after(start_step)
        self.bar = None
        if progress and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, desc=job, unit="step", dynamic_ncols=True)
        self.gauges: dict[str, Any] = {}
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

        self.registry = CollectorRegistry()
        server, _ = start_http_server(port, addr=address, registry=self.registry)
        self.server = server
        self.port = server.server_address[1]

    def _gauge(self, key: str):
        from prometheus_client import Gauge

        if key not in self.gauges:
            self.gauges[key] = Gauge(f"kuberl_{key}", f"kuberl runtime metric {key}", ["job"], registry=self.registry)
        return self.gauges[key]

    def log(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        if self.registry is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._gauge(key).labels(job=self.job).set(value)
        shown = {label: record[k] for k, label in PROGRESS_KEYS if k in record}
        if self.bar is not None:
            self.bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()}, refresh=False)
            self.bar.update(1)
        else:
            parts = " ".join(f"{k}={v:.4g}" for k, v in shown.items())
            print(f"[{self.job}] step {record['step']}/{self.total} {parts} step_s={record.get('time_step_s', 0):.2f}", flush=True)

    def close(self) -> None:
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
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(jsonl.parent.name)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png

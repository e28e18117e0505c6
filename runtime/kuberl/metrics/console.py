"""What a person watching sees per step: a tqdm bar when stderr is a terminal, else one log line."""

from __future__ import annotations

import sys
from typing import Any

from kuberl.metrics.record import StepRecord


def shown(rec: StepRecord) -> dict[str, float]:
    """The few figures the bar and the log line show."""
    values = {"reward": rec.reward_mean, "kl": rec.stats.get("kl"), "tok/s": rec.rollout_tokens_per_s}
    return {label: v for label, v in values.items() if v is not None}


class Console:
    def __init__(self, job: str, total_steps: int, start_step: int = 0, bar: bool = True):
        self.job, self.total = job, total_steps
        self.bar: Any = None
        if bar and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, desc=job, unit="step", dynamic_ncols=True)

    def write(self, rec: StepRecord) -> None:
        figures = shown(rec)
        if self.bar is not None:
            self.bar.set_postfix({k: f"{v:.3g}" for k, v in figures.items()}, refresh=False)
            self.bar.update(1)
            return
        parts = " ".join(f"{k}={v:.4g}" for k, v in figures.items())
        print(f"[{self.job}] step {rec.step}/{self.total} {parts} step_s={rec.step_s or 0:.2f}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

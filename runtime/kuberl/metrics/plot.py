"""The reward curve of a `metrics.jsonl`, as a PNG."""

from __future__ import annotations

from pathlib import Path

from .jsonl import read_jsonl


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
        ax.plot([r["step"] for r in evals], [r["eval_reward_mean"] for r in evals], "o-", lw=1.5,
                label="eval (greedy)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(jsonl.parent.name)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png

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


ROLE_ROWS = ("actor", "env", "critic", "ref", "reward", "driver")  # top to bottom; other (extra) roles after these


def plot_timeline(jsonl: Path, png: Path, last: int = 4) -> Path | None:
    """A Gantt chart of the last `last` steps of a metrics.jsonl: a row per role, a bar per phase
    (seconds since the run's driver started), a dotted line where each step began. Written only when
    the rows carry a `timeline` (see `kuberl.metrics.record.Span`); returns the PNG, or None."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_jsonl(jsonl) if r.get("timeline")][-last:]
    if not rows:
        return None
    bars = [(s["role"], s["phase"], r["step_start_s"] + s["start_s"], s["end_s"] - s["start_s"])
            for r in rows for s in r["timeline"]]
    seen = {role for role, *_ in bars}
    roles = [r for r in ROLE_ROWS if r in seen] + sorted(seen - set(ROLE_ROWS))
    phases = list(dict.fromkeys(phase for _, phase, *_ in bars))
    colours = {p: plt.get_cmap("tab10")(i % 10) for i, p in enumerate(phases)}
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(roles) + 1.6), dpi=100)
    for role, phase, start, width in bars:
        ax.broken_barh([(start, width)], (roles.index(role) - 0.4, 0.8), facecolors=colours[phase],
                       edgecolor="white", linewidth=0.5)
    for r in rows:
        ax.axvline(r["step_start_s"], color="grey", ls=":", lw=1)
        ax.text(r["step_start_s"], len(roles) - 0.45, f" step {r['step']}", fontsize=7, color="grey")
    ax.set_yticks(range(len(roles)), roles)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the driver started")
    ax.set_title(f"{jsonl.parent.name}: phases per role, last {len(rows)} steps")
    ax.legend(handles=[matplotlib.patches.Patch(color=colours[p], label=p) for p in phases], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png

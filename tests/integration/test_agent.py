"""Agentic RL end to end on CPU (examples/agent.yaml): a two-turn environment whose second turn asks, in its
observation, for another letter; GRPO on real Ray actors learns it, every trajectory takes both turns, and the
environment's figures are in metrics.jsonl."""

from __future__ import annotations

from kuberl.metrics import read_jsonl
from kuberl.run import run_job

from .conftest import load_example


def mean(rows: list[dict], key: str = "reward_mean") -> float:
    return sum(r[key] for r in rows) / len(rows)


def test_a_two_turn_environment_is_learned_on_ray(ray_session, tmp_path):
    # the module as the Ray workers import it (the repository's root is on their path, as for examples.remax)
    job = load_example("agent.yaml", **{"environment.module": "examples.letter_env"})
    run_job(job, tmp_path, backend="ray", progress=False)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, job.spec.trainer.steps + 1))
    first, last = mean(rows[:10]), mean(rows[-10:])
    print(f"agent reward first10={first:.3f} last10={last:.3f}")
    assert last - first >= 0.05 and last >= 2 * first
    assert all(r["env_turns_mean"] == 2.0 and r["env_failed"] == 0.0 and r["env_truncated"] == 0.0 for r in rows)
    # the reward is the environment's alone (reward.function: environment)
    assert all(abs(r["env_reward_mean"] - r["reward_mean"]) < 1e-6 for r in rows)
    # the timeline has the environment's calls on a row of their own, inside the actor's rollout
    for r in rows:
        rollout = next(s for s in r["timeline"] if (s["role"], s["phase"]) == ("actor", "rollout"))
        env = [s for s in r["timeline"] if s["role"] == "env"]
        assert {s["phase"] for s in env} == {"env_reset", "env_step"}
        assert all(rollout["start_s"] <= s["start_s"] < s["end_s"] <= rollout["end_s"] for s in env)
    assert (tmp_path / "timeline.png").exists()

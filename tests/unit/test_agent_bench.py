"""bench/agent_rollout.py's CPU smoke mode: the env role in-process, a GRPO job per environment latency, each with
measured trajectories per second and the rollout's wait on its environments (the GPU figure's method, on CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_agent_bench_measures_each_latency(netns: None) -> None:
    run = subprocess.run([sys.executable, "bench/agent_rollout.py", "--quick"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    summaries = {r["env_ms"]: r for r in lines if r.get("kind") == "agent"}
    assert sorted(summaries) == [0.0, 20.0] and len([r for r in lines if "step" in r]) == 4
    for s in summaries.values():
        assert s["trajectories_per_s"] > 0 and 0 <= s["env_wait_share"] <= 1 and s["failed"] == 0
        assert s["turns_per_s"] >= s["trajectories_per_s"]  # every trajectory took at least one turn
    # each of the two turns' steps took 20 ms: the rollout waited for them with nothing to generate
    assert summaries[20.0]["env_wait_s"] >= 0.02 > summaries[0.0]["env_wait_s"]

"""bench/async_rollout.py --quick: one-step-off and maxStaleness modes run real quickstart steps through Ray and
print measured figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_async_bench_prints_each_mode(netns) -> None:
    run = subprocess.run([sys.executable, "bench/async_rollout.py", "--quick"], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [r["mode"] for r in rows] == ["one-step-off", "async-1", "async-2"]
    for r in rows:
        assert r["bench"] == "async_rollout" and r["steps"] == 3 and r["timed_steps"] == 2
        assert r["steps_per_s"] > 0 and r["samples_dropped_stale"] == r["samples_lost_rollout"] == 0
    # one-step-off: every batch after the first one update stale; async-k: none more than k (a loaded machine
    # may start a generation after the next push, so less)
    assert rows[0]["staleness"] == [0, 1, 1]
    assert rows[1]["staleness"][0] == rows[2]["staleness"][0] == 0
    assert max(rows[1]["staleness"]) <= 1 and max(rows[2]["staleness"]) <= 2
    assert "| async-2 |" in run.stdout and "3 steps per mode, first 1 not timed" in run.stdout

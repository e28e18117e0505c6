"""bench/overlap.py --quick: the three modes run real quickstart steps through Ray and print measured figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_overlap_bench_prints_each_mode(netns) -> None:
    run = subprocess.run([sys.executable, "bench/overlap.py", "--quick"], cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [r["mode"] for r in rows] == ["sequential", "overlapped", "async"]
    for r in rows:
        assert r["bench"] == "overlap" and r["steps"] == 2 and r["timed_steps"] == 1
        assert 0 < r["step_s_median"] and 0 < r["step_s_mean"]
        assert 0 <= r["reward_first10"] <= 1 and 0 <= r["reward_last10"] <= 1
    # the async mode ran one step off (its batches after the first one update stale); the others on-policy
    assert rows[0]["staleness"] == rows[1]["staleness"] == [0, 0] and rows[2]["staleness"] == [0, 1]
    # the overlapped loop is bit-identical to the sequential one (tests/integration/test_overlap.py), reward too
    assert rows[0]["reward_first10"] == rows[1]["reward_first10"]
    assert "| async |" in run.stdout and "steps per mode, first 1 not timed" in run.stdout

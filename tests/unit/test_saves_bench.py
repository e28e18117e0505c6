"""bench/saves.py --quick: every variant runs real PPO steps in-process and prints a measured step time; bench/
checkpoint_write.py measures each way of writing a checkpoint from a slot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_saves_bench_prints_each_variant(netns) -> None:
    run = subprocess.run([sys.executable, "bench/saves.py", "--quick"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [r["variant"] for r in rows] == ["off", "snapshots", "checkpoint_sync", "checkpoint_async"]
    assert all(r["step_s_median"] > 0 for r in rows)
    assert rows[1]["checkpoint_phase_s_median"] == 0 and rows[3]["checkpoint_phase_s_median"] > 0
    assert rows[1]["snapshot_stage_s_median"] > 0 and rows[1]["snapshot_write_s_median"] > 0
    assert rows[1]["snapshot_staged_s_per_step"] > 0 and rows[1]["snapshot_waited_s_per_step"] >= 0
    assert "| snapshots |" in run.stdout and "snapshots per step (actor + critic), in the run: staging" in run.stdout


def test_checkpoint_write_bench_measures_each_way() -> None:
    run = subprocess.run([sys.executable, "bench/checkpoint_write.py", "--gib", "0.125", "--reps", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [r["variant"] for r in rows] == ["runtime", "crc", "whole_slot", "before"]
    assert all(r["gb_per_s"] > 0 and r["probe_max_gap_ms"] > 0 and r["state_gb"] == 2 * 64 * 2**20 / 1e9 for r in rows)
    assert "| runtime |" in run.stdout

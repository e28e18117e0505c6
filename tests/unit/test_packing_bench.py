"""`bench/packing.py --quick`: padded, packed and token-budget updates of the same spread batch run on the CPU, report
their train tokens/s and padding waste, and start from the same loss."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_quick_bench_times_padded_packed_and_budget_updates(tmp_path: Path, netns) -> None:
    out = tmp_path / "packing.json"
    run = subprocess.run([sys.executable, "bench/packing.py", "--quick", "--json", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert list(rows) == ["padded", "packed", "budget"]
    assert all(row["s"] > 0 and row["train_tokens_per_s"] > 0 for row in rows.values())
    # the same batch and weights: the first update's loss is the padded path's
    for name in ("packed", "budget"):
        assert rows[name]["pg_loss_first"] == pytest.approx(rows["padded"]["pg_loss_first"], rel=1e-5), name
    assert 0 < result["padding_waste_train"] < result["padding_waste_rollout"] < 1
    assert "| budget |" in run.stdout and "padding waste: training batch" in run.stdout

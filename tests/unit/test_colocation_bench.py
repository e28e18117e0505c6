"""`bench/colocation.py --quick`: the colocation memory bench runs on CPU, colocated losses equal apart's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_bench_runs_apart_and_colocated(tmp_path: Path, netns) -> None:
    out = tmp_path / "colocation.json"
    run = subprocess.run([sys.executable, "bench/colocation.py", "--quick", "--modes", "apart,offload",
                          "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert list(rows) == ["apart", "offload"]
    assert rows["offload"]["max_loss_diff_vs_apart"] == 0.0  # on the CPU the policy's moves change nothing
    assert len(rows["apart"]["losses"]) == 2 and set(rows["apart"]["role_peak_gib"]) == {"actor", "critic", "ref"}
    assert "| offload |" in run.stdout

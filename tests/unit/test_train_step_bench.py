"""`bench/train_step.py --quick`: every offload and LoRA setting of the training-step bench runs on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_bench_times_every_memory_setting(tmp_path: Path, netns) -> None:
    out = tmp_path / "train_step.json"
    run = subprocess.run([sys.executable, "bench/train_step.py", "--quick", "--json", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert list(rows) == ["runtime/none", "runtime/optimizer", "runtime/params", "runtime/lora"]
    for name, row in rows.items():
        assert not row.get("oom") and row["ms"] > 0 and row["tokens_per_s"] > 0, name
    assert rows["runtime/params"]["setup"] == {"offload": {"params": True, "optimizer": True}}
    assert 0 < rows["runtime/lora"]["trainable_params"] < rows["runtime/none"]["trainable_params"]
    assert "| runtime/optimizer |" in run.stdout

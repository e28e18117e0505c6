"""The rollout benchmarks' CPU smoke mode, and the comparison script's runner and tables.

`bench/compare_rollout.py run --quick` runs bench/rollout.py --quick (tiny model on CPU: the static
decoder, transformers' static-cache generate, a profile of decode steps) in its own subprocess, and
records the vLLM unit as skipped where vLLM is missing; the GPU figures come from the lease (docs).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import compare_rollout  # noqa: E402


def test_quick_comparison_runs_units_in_subprocesses_and_records_every_outcome(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "bench/compare_rollout.py", "run", "--quick", "--out", str(tmp_path),
                          "--units", "hf-quick,vllm-quick"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    tput = {(r["variant"], r["top_p"]) for r in rows if r["kind"] == "throughput"}
    assert {("graphs", 1.0), ("graphs", 0.9), ("generate-static", 1.0)} <= tput
    assert all(r["tokens_per_s"] > 0 and r["tokens"] == 4 * 8 for r in rows if r["kind"] == "throughput")
    profiles = [r for r in rows if r["kind"] == "profile"]
    assert profiles and profiles[0]["top"] and profiles[0]["wall_us_per_step"] > 0
    skipped = {(r.get("unit") or r.get("variant")) for r in rows if r["kind"] == "skipped"}
    assert {"fast", "cb"} <= skipped  # CUDA-only variants say why
    units = {r["unit"]: r for r in rows if r["kind"] == "unit"}
    assert units["hf-quick"]["rc"] == 0 and not units["hf-quick"]["timed_out"]
    if "vllm-quick" not in units:  # no vLLM here: recorded, not silently dropped
        assert "vllm-quick" in skipped
    assert "hf graphs, no compile" in run.stdout and (tmp_path / "log.txt").exists()


def test_table_puts_each_engine_in_its_column_with_the_ratios() -> None:
    def row(variant: str, tps: float, top_p: float = 1.0) -> dict:
        return {"kind": "throughput", "model": "qwen2-0.5b", "batch": 256, "top_p": top_p, "variant": variant,
                "tokens_per_s": tps}

    rows = [row("vllm-plain", 50000), row("vllm-engine", 48000), row("fast", 120000), row("cb", 30000),
            row("generate-static", 40000), row("fast", 110000, 0.9),
            {"kind": "unit", "unit": "vllm-0.5b", "rc": 1, "timed_out": False, "seconds": 3.0},
            {"kind": "ppo", "unit": "ppo-vllm-0.5b", "summary": {"phases_s": {"rollout": 1.5}, "step_s": 2.5,
                                                                 "device_peak_gib": 70.2}}]
    text = compare_rollout.render(rows)
    line = next(x for x in text.splitlines() if x.startswith("| qwen2-0.5b | 256 | 1.0 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3] == "50.0k" and cells[6] == "48.0k" and cells[7] == "120.0k" and cells[-2] == "96.0%"
    assert cells[-1] == "33.3%"  # best transformers path (static generate) over our fast path
    assert "unit: vllm-0.5b  exit 1" in text and "| rollout | 1.500 |" in text and "| **step total** | 2.500 |" in text

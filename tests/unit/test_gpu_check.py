"""`make gpu-check`'s verdicts (bench/gpu_check.py), on result rows of the shape its units write: a figure more
than 10 % worse than the baseline fails, in the direction that is worse for it; a missing figure or a failed GPU
test fails; the baseline changes only with a reason."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import gpu_check  # noqa: E402


def rows(tokens: float = 100_000.0, step_s: float = 1.5, mfu: float = 0.5, save_s: float = 0.2,
         tests_rc: int = 0) -> list[dict]:
    out = [{"kind": "unit", "unit": "gpu-tests", "rc": tests_rc, "timed_out": False, "summary": "17 passed"}]
    for top_p in (1.0, 0.9):
        out.append({"kind": "throughput", "variant": "fast", "model": "qwen2-0.5b", "batch": 256, "top_p": top_p,
                    "tokens_per_s": tokens, "device": "NVIDIA H200"})
    for model in ("qwen2-0.5b", "qwen2-1.5b"):
        out.append({"kind": "ppo", "args": {"model": model}, "summary": {
            "step_s": step_s, "checkpoint_s": {"8": save_s}, "train_step": {"runtime": {"mfu_6nt": mfu}}}})
    return out


BASE = gpu_check.measured(rows())


def test_the_same_figures_pass_and_every_figure_is_read() -> None:
    assert all(v is not None for v in BASE.values()) and len(BASE) == len(gpu_check.FIGURES)
    text, ok = gpu_check.table(rows(), BASE)
    assert ok and text.count("| ok |") == len(gpu_check.FIGURES) + 1, text


@pytest.mark.parametrize("changed, fails", [
    ({"tokens": 89_000.0}, True), ({"tokens": 91_000.0}, False), ({"tokens": 200_000.0}, False),  # higher: better
    ({"step_s": 1.7}, True), ({"step_s": 1.6}, False), ({"step_s": 0.5}, False),  # lower: better
    ({"mfu": 0.44}, True), ({"save_s": 0.3}, True), ({"tests_rc": 1}, True),
])
def test_more_than_ten_percent_worse_fails(changed: dict, fails: bool) -> None:
    text, ok = gpu_check.table(rows(**changed), BASE)
    assert ok is not fails, text


def test_a_figure_not_measured_fails() -> None:
    text, ok = gpu_check.table([r for r in rows() if r.get("kind") != "ppo"], BASE)
    assert not ok and "FAIL: not measured" in text


def test_the_baseline_changes_only_with_a_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    assert gpu_check.main(["--table", str(results), "--update-baseline"]) == 2
    assert gpu_check.main(["--table", str(results)]) in (0, 1)
    assert "needs --reason" in capsys.readouterr().err
    path = tmp_path / "baseline.json"
    doc = gpu_check.write_baseline(rows(), "first baseline", "NVIDIA H200", path)
    assert gpu_check.read_baseline("NVIDIA H200", path) == doc and doc["reason"] == "first baseline"
    assert doc["figures"] == BASE


def test_a_run_is_held_to_its_own_devices_baseline_only(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    gpu_check.write_baseline(rows(), "H200 figures", "NVIDIA H200", path)
    h100 = gpu_check.write_baseline(rows(step_s=2.0), "H100 figures", "NVIDIA H100 80GB HBM3", path)
    assert gpu_check.read_baseline("NVIDIA H200", path)["reason"] == "H200 figures"  # kept beside the new one
    assert gpu_check.read_baseline("NVIDIA H100 80GB HBM3", path) == h100
    assert gpu_check.read_baseline("NVIDIA A100", path) == {"figures": {}}
    text, ok = gpu_check.table(rows(step_s=2.0), gpu_check.read_baseline("NVIDIA A100", path)["figures"])
    assert ok and "no baseline" in text  # nothing to compare with: no verdict on the figures


def test_the_device_is_read_from_the_ppo_summary_when_no_fast_path_ran() -> None:
    ppo_only = [{"kind": "ppo", "args": {"model": "qwen2-0.5b"}, "summary": {"device": "NVIDIA H100 80GB HBM3"}}]
    assert gpu_check.device_name(ppo_only) == "NVIDIA H100 80GB HBM3"
    assert gpu_check.device_name(rows()) == "NVIDIA H200"


def test_the_baseline_in_the_repository_is_keyed_by_device() -> None:
    baselines = gpu_check.read_baselines()
    assert baselines and all(doc["reason"] and doc["figures"] for doc in baselines.values())


def test_the_host_is_measured_and_another_host_is_named() -> None:
    host = gpu_check.host_figures()
    assert host["kind"] == "host" and host["cpu"] and host["cores"] >= 1
    assert host["python_madds_per_s"] > 0 and host["memcpy_gb_per_s"] > 0
    same = {k: v for k, v in host.items() if k != "kind"}
    assert gpu_check.host_note([host], {"host": same}).endswith(": the same host kind")
    slower = {**same, "python_madds_per_s": host["python_madds_per_s"] * 1.3}
    assert "ANOTHER HOST" in gpu_check.host_note([host], {"host": slower})
    assert "ANOTHER HOST" in gpu_check.host_note([host], {"host": {**same, "cpu": "another CPU"}})
    assert gpu_check.host_note([host], {}).endswith("the baseline's host was not recorded")
    assert gpu_check.host_note(rows(), {"host": same}) == "host: not recorded in these results"


def test_the_baseline_keeps_the_host_it_was_measured_on(tmp_path: Path) -> None:
    host = {"kind": "host", "cpu": "a CPU", "cores": 16, "python_madds_per_s": 30.0, "memcpy_gb_per_s": 10.0}
    doc = gpu_check.write_baseline([*rows(), host], "a reason", "NVIDIA H200", tmp_path / "b.json")
    assert doc["host"] == {"cpu": "a CPU", "cores": 16, "python_madds_per_s": 30.0, "memcpy_gb_per_s": 10.0}

"""Step time of the quickstart on CPU through the real Ray path: one phase after another, the synchronous
loop with its independent phases overlapped (the default), and the one-step-off asynchronous rollout
(spec.rollout.asynchronous). All three in one local Ray session, each from a fresh output folder.

Prints one JSON line per mode (mean/median step seconds over the steps after `--warmup`, the reward's
first and last 10-step means, each step's staleness) and a Markdown table.

    unshare -rn sh -c 'ip link set lo up; PYTHONPATH=runtime .venv/bin/python bench/overlap.py --steps 40'
    ... bench/overlap.py --quick      # 2 steps per mode, 1 not timed: a smoke run (tests/unit/test_overlap_bench.py)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

import yaml

from kuberl.controller.driver import Driver
from kuberl.run import quiet_local_ray, start_local_ray
from kuberl.spec import validate_manifest
from kuberl.workers.groups import RayWorkerGroup

REPO = Path(__file__).resolve().parents[1]
MODES = ("sequential", "overlapped", "async")


def spec_for(steps: int, mode: str):
    obj = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    obj["spec"]["trainer"].update(steps=steps, checkpoint={"interval": steps})
    obj["spec"]["rollout"]["asynchronous"] = mode == "async"
    return validate_manifest(obj).spec


def one_mode(mode: str, steps: int, warmup: int) -> dict:
    spec = spec_for(steps, mode)
    with tempfile.TemporaryDirectory() as d:
        driver = Driver(spec, f"overlap-{mode}", Path(d), lambda r: RayWorkerGroup(r, spec), progress=False)
        driver.sequential = mode == "sequential"
        driver.start()
        try:
            records = driver.run()
        finally:
            driver.shutdown()
    times = [r.step_s for r in records[warmup:]]
    rewards = [r.reward_mean for r in records]
    k = min(10, len(rewards))
    return {"bench": "overlap", "mode": mode, "steps": steps, "timed_steps": len(times),
            "step_s_mean": statistics.fmean(times), "step_s_median": statistics.median(times),
            "reward_first10": statistics.fmean(rewards[:k]), "reward_last10": statistics.fmean(rewards[-k:]),
            "staleness": [r.staleness for r in records]}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3, help="first steps left out of the timing")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--quick", action="store_true", help="2 steps per mode, 1 warm-up (a smoke run)")
    args = ap.parse_args(argv)
    steps, warmup = (2, 1) if args.quick else (args.steps, args.warmup)
    quiet_local_ray()
    start_local_ray(spec_for(steps, "sequential"))
    rows = []
    for mode in args.modes.split(","):
        rows.append(one_mode(mode, steps, warmup))
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["step_s_mean"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"quickstart, {steps} steps per mode, first {warmup} not timed")
    print("| mode | step s (mean) | step s (median) | vs first | reward first10 -> last10 |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['mode']} | {r['step_s_mean']:.3f} | {r['step_s_median']:.3f} | {base / r['step_s_mean']:.2f}x | "
              f"{r['reward_first10']:.3f} -> {r['reward_last10']:.3f} |")
    return rows


if __name__ == "__main__":
    main()

"""Step throughput of the quickstart on CPU under Ray: the one-step-off rollout (spec.rollout.asynchronous) and the
fully asynchronous one (spec.rollout.async, a rollout role of its own, maxStaleness k), side by side in one local
Ray session, each from a fresh output folder; actor, critic, ref, reward (and rollout) each in its own process.

Prints one JSON line per mode (steps per second over the steps after `--warmup`, wall clock from the first timed
step's start to the last one's end; the reward's first and last 10-step means; staleness and samples dropped or
lost) and a Markdown table. Figures are measured on the machine it runs on; none is expected.

    unshare -rn sh -c 'ip link set lo up; PYTHONPATH=runtime .venv/bin/python bench/async_rollout.py --steps 40'
    ... bench/async_rollout.py --max-new-tokens 64    # a rollout-heavy step: every response 64 tokens
    ... bench/async_rollout.py --quick      # 3 steps per mode, 1 not timed: a smoke run
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
from kuberl.spec import JobSpec, validate_manifest
from kuberl.workers.groups import RayWorkerGroup

REPO = Path(__file__).resolve().parents[1]


def spec_for(steps: int, mode: str, max_new_tokens: int | None = None) -> JobSpec:
    """The quickstart for `steps` steps in `mode`: one-step-off, or async-<k> (maxStaleness k); `max_new_tokens`:
    every response that long (rollout.fixedLength), a rollout-heavy step."""
    obj = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    obj["spec"]["trainer"].update(steps=steps, checkpoint={"interval": steps})
    if max_new_tokens is not None:
        obj["spec"]["rollout"].update(maxNewTokens=max_new_tokens, fixedLength=True)
    if mode == "one-step-off":
        obj["spec"]["rollout"]["asynchronous"] = True
    else:
        obj["spec"]["rollout"]["async"] = {"maxStaleness": int(mode.split("-")[1])}
        obj["spec"]["roles"]["rollout"] = {"replicas": 1, "resources": {"cpu": "500m", "memory": "1Gi"}}
    return validate_manifest(obj).spec


def one_mode(mode: str, steps: int, warmup: int, max_new_tokens: int | None) -> dict:
    spec = spec_for(steps, mode, max_new_tokens)
    with tempfile.TemporaryDirectory() as d:
        driver = Driver(spec, f"async-{mode}", Path(d), lambda r: RayWorkerGroup(r, spec), progress=False)
        driver.start()
        try:
            records = driver.run()
        finally:
            driver.shutdown()
    timed = records[warmup:]
    wall = timed[-1].start_s + timed[-1].step_s - timed[0].start_s
    rewards = [r.reward_mean for r in records]
    k = min(10, len(rewards))
    return {"bench": "async_rollout", "mode": mode, "steps": steps, "timed_steps": len(timed),
            "steps_per_s": len(timed) / wall, "step_s_median": statistics.median(r.step_s for r in timed),
            "reward_first10": statistics.fmean(rewards[:k]), "reward_last10": statistics.fmean(rewards[-k:]),
            "staleness": [r.staleness for r in records],
            "samples_dropped_stale": sum(r.stats.get("samples_dropped_stale", 0.0) for r in records),
            "samples_lost_rollout": sum(r.stats.get("samples_lost_rollout", 0.0) for r in records)}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3, help="first steps left out of the timing")
    ap.add_argument("--modes", default="one-step-off,async-1,async-2", help="one-step-off and async-<maxStaleness>")
    ap.add_argument("--max-new-tokens", type=int, help="fixed-length responses of this many tokens (default: the "
                                                        "quickstart's, up to EOS)")
    ap.add_argument("--quick", action="store_true", help="3 steps per mode, 1 warm-up (a smoke run)")
    args = ap.parse_args(argv)
    steps, warmup = (3, 1) if args.quick else (args.steps, args.warmup)
    modes = args.modes.split(",")
    quiet_local_ray()
    start_local_ray(spec_for(steps, modes[-1]))
    rows = []
    for mode in modes:
        rows.append(one_mode(mode, steps, warmup, args.max_new_tokens))
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["steps_per_s"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"quickstart under Ray, {steps} steps per mode, first {warmup} not timed"
          + (f", responses of {args.max_new_tokens} tokens" if args.max_new_tokens else ""))
    print("| mode | steps/s | step s (median) | vs first | reward first10 -> last10 | staleness max | dropped | lost |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['mode']} | {r['steps_per_s']:.3f} | {r['step_s_median']:.3f} | {r['steps_per_s'] / base:.2f}x | "
              f"{r['reward_first10']:.3f} -> {r['reward_last10']:.3f} | {max(r['staleness'])} | "
              f"{r['samples_dropped_stale']:.0f} | {r['samples_lost_rollout']:.0f} |")
    return rows


if __name__ == "__main__":
    main()

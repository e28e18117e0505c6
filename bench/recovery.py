"""Recovery time per role on CPU with the quickstart model, through the real Ray path.

Each repeat runs the quickstart for 10 steps in one local Ray session, SIGKILLing one role's worker at
steps 3 (actor), 5 (critic), 7 (ref) and 9 (reward). Prints detection / group-ready / replay seconds
per role (median and range over repeats) as a Markdown table and one JSON line per role, for a cold
restart (`--standby off`: new processes import torch and transformers and build the models), a warm
standby (`--standby on`: spec.resilience.standby, kuberl.resilience.standby: actor and critic standbys load each
completed step's snapshot once it is whole: `standby_follow_s` is what that load took per step, median, slowest
rank, and `standby_first_load_s` a new standby's first one, with torch's first-call costs) or both.

    unshare -n sh -c 'ip link set lo up; PYTHONPATH=$PWD/runtime .venv/bin/python bench/recovery.py --standby both'
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

from kuberl.controller.driver import Driver, Fault
from kuberl.run import start_local_ray
from kuberl.spec import validate_manifest
from kuberl.workers.groups import RayWorkerGroup

REPO = Path(__file__).resolve().parents[1]
SCHEDULE = {"actor": 3, "critic": 5, "ref": 7, "reward": 9}


Result = tuple[float, float, float, bool, str, list[tuple[int, float]]]


def one_run(spec, out: Path) -> dict[str, Result]:
    """Per role, of its one recovery: (detect, ready, replay seconds, whether a standby took over, where
    its state came from, its standbys' snapshot loads: (that standby's how-manieth, slowest rank's s))."""
    faults = [Fault(role, step) for role, step in SCHEDULE.items()]
    driver = Driver(spec, "recovery-bench", out, lambda r: RayWorkerGroup(r, spec, timeout_s=120), faults,
                    progress=False)
    driver.start()
    try:
        driver.roles.wait_standbys()  # a failure right after start would wait for its standby to finish setting up
        driver.run()
    finally:
        driver.shutdown()
    recs = {role: h.recoveries[0] for role, h in driver.history.items()}
    return {role: (r.detect_s, r.ready_s, r.replay_s, r.standby, r.restored_from,
                   [(n, max(per_rank)) for n, per_rank in getattr(driver.groups[role], "follow_results", [])])
            for role, r in recs.items()}


def median_or_none(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def report(mode: str, runs: list[dict[str, Result]]) -> None:
    print(f"\nstandby {mode}:")
    print("| role | detection s | group ready s | phase replay s | total s (median, min-max) | restored from |")
    print("| --- | --- | --- | --- | --- | --- |")
    lines = []
    for role in SCHEDULE:
        detect, ready, replay, took_over, restored, follows = zip(*[r[role] for r in runs])
        totals = [d + g + p for d, g, p in zip(detect, ready, replay)]
        med = [statistics.median(p) for p in (detect, ready, replay)]
        total = statistics.median(totals)
        span = f"{total:.2f} ({min(totals):.2f}-{max(totals):.2f})"
        print(f"| {role} | {med[0]:.3f} | {med[1]:.2f} | {med[2]:.3f} | {span} | {'; '.join(sorted(set(restored)))} |")
        loads = [load for run in follows for load in run]
        lines.append({"bench": "recovery", "standby": mode, "role": role, "repeats": len(runs),
                      "detect_s": round(med[0], 4), "ready_s": round(med[1], 4), "replay_s": round(med[2], 4),
                      "total_s": round(total, 4), "total_min_s": round(min(totals), 4),
                      "total_max_s": round(max(totals), 4), "standby_took_over": all(took_over),
                      "restored_from": sorted(set(restored)),
                      "standby_first_load_s": median_or_none([s for n, s in loads if n == 0]),
                      "standby_follow_s": median_or_none([s for n, s in loads if n > 0])})
    for line in lines:
        print(json.dumps(line))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--standby", choices=("off", "on", "both"), default="both",
                    help="spec.resilience.standby for the runs: a cold restart, a warm standby, or each in turn")
    args = ap.parse_args()
    obj = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    obj["spec"]["trainer"].update(steps=10, checkpoint={"interval": 2})
    modes = ("off", "on") if args.standby == "both" else (args.standby,)
    specs = {}
    for mode in modes:
        obj["spec"]["resilience"] = {"standby": mode == "on"}
        specs[mode] = validate_manifest(obj).spec
    start_local_ray(specs[modes[-1]])  # resources for the largest mode (a standby doubles each role's)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}; repeats={args.repeats}")
    for mode in modes:
        runs = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as d:
                runs.append(one_run(specs[mode], Path(d)))
        report(mode, runs)


if __name__ == "__main__":
    main()

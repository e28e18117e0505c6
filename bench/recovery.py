"""Recovery time per role on CPU with the quickstart model, through the real Ray path.

Each repeat runs the quickstart for 10 steps in one local Ray session, SIGKILLing one role's worker at
steps 3 (actor), 5 (critic), 7 (ref) and 9 (reward). Prints detection / group-ready / replay seconds
per role (median and range over repeats) as a Markdown table.

    unshare -n sh -c 'ip link set lo up; .venv/bin/python bench/recovery.py --repeats 3'
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
from pathlib import Path

import yaml

from kuberl.driver import Driver, Fault
from kuberl.groups import RayWorkerGroup
from kuberl.run import start_local_ray
from kuberl.spec import validate_manifest

REPO = Path(__file__).resolve().parents[1]
SCHEDULE = {"actor": 3, "critic": 5, "ref": 7, "reward": 9}


def one_run(spec, out: Path) -> dict[str, tuple[float, float, float]]:
    faults = [Fault(role, step) for role, step in SCHEDULE.items()]
    driver = Driver(spec, "recovery-bench", out, lambda r: RayWorkerGroup(r, spec, timeout_s=120), faults,
                    progress=False)
    driver.start()
    try:
        driver.run()
    finally:
        driver.shutdown()
    return {role: (h.recoveries[0].detect_s, h.recoveries[0].ready_s, h.recoveries[0].replay_s)
            for role, h in driver.history.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    obj = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    obj["spec"]["trainer"].update(steps=10, checkpoint={"interval": 2})
    spec = validate_manifest(obj).spec
    start_local_ray(spec)
    runs = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as d:
            runs.append(one_run(spec, Path(d)))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}; repeats={args.repeats}")
    print("| role | detection s | group ready s | phase replay s | total s (median, min-max) |")
    print("| --- | --- | --- | --- | --- |")
    for role in SCHEDULE:
        parts = list(zip(*[r[role] for r in runs]))
        totals = [sum(x) for x in zip(*parts)]
        med = [statistics.median(p) for p in parts]
        total = f"{statistics.median(totals):.2f} ({min(totals):.2f}-{max(totals):.2f})"
        print(f"| {role} | {med[0]:.3f} | {med[1]:.2f} | {med[2]:.3f} | {total} |")


if __name__ == "__main__":
    main()

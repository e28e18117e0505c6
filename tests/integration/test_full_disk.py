"""A full disk during training (issue 28, scenario 4): the quickstart writes its output folder (checkpoints,
snapshots, metrics.jsonl, TensorBoard) on a small tmpfs of its own, and a file fills that tmpfs during a
periodic save, until one save has been made void; then the file goes.

What must hold: the job completes; each save that found no room is void (never marked complete) with a warning,
and training goes on; the saves after room returns succeed, the last one included; every checkpoint marked
complete is whole (each role's part has its DCP metadata); metrics.jsonl holds every step once (the rows refused
by the full disk were kept and written when room returned).

Root, in a mount namespace of its own (`unshare -m`: the tmpfs is seen by nothing else), inside the tests'
loopback-only network namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kuberl.resilience import checkpoint, saves

from .conftest import REPO

STEPS, FILL_AT = 40, 12

# Runs in the mount namespace: the tmpfs, the job, the filler (dd until ENOSPC) once step FILL_AT is in
# metrics.jsonl, removed once the log shows a void checkpoint (a
# role's part torn, or no room for its state file, whichever the filler's timing gives); the job's exit status last.
SCRIPT = """
set -u
mount -t tmpfs -o size=120m tmpfs "$DISK"
"$PY" -m kuberl.cli run examples/quickstart.yaml --out "$DISK/run" --steps "$STEPS" --no-progress > "$LOG" 2>&1 &
job=$!
until grep -q "\\"step\\": $FILL_AT," "$DISK/run/metrics.jsonl" 2>/dev/null; do
  kill -0 $job 2>/dev/null || break; sleep 0.2
done
dd if=/dev/zero of="$DISK/filler" bs=1M 2>/dev/null
until grep -q "the newest complete checkpoint stays step" "$LOG"; do kill -0 $job 2>/dev/null || break; sleep 0.2; done
rm -f "$DISK/filler"
wait $job
status=$?
cp -r "$DISK/run" "$KEEP"
exit $status
"""


@pytest.fixture(scope="module")
def full_disk(tmp_path_factory, netns) -> tuple[int, str, Path]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a tmpfs of its own needs root and unshare (util-linux)")
    work = tmp_path_factory.mktemp("full-disk")
    (work / "disk").mkdir()
    env = {**os.environ, "DISK": str(work / "disk"), "LOG": str(work / "log.txt"), "KEEP": str(work / "run"),
           "PY": sys.executable, "STEPS": str(STEPS), "FILL_AT": str(FILL_AT)}
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", SCRIPT], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    log = (work / "log.txt").read_text()
    return done.returncode, log, work / "run"


def test_a_full_disk_voids_a_save_and_training_goes_on(full_disk) -> None:
    code, log, run = full_disk
    assert code == 0, log[-3000:]
    void = [line for line in log.splitlines() if "the newest complete checkpoint stays step" in line]
    assert void and all(" removed: the part of " in line or " is void " in line for line in void), log[-3000:]
    # the cause is named: ENOSPC, no room for a snapshot slot, or torch's zip writer's short write (whichever
    # write the filler's timing hits first; the last says how much room was left)
    assert any(cause in log for cause in ("No space left on device", "NoRoom", "a short write: ")), log[-3000:]
    root = run / "checkpoints"
    complete = checkpoint.complete_steps(root)
    assert complete and complete[-1] == STEPS, complete  # the saves after room returned, the last one included
    for step in complete:
        for role in ("actor", "critic"):
            assert saves.complete(checkpoint.step_dir(root, step) / role), (step, role)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    print(f"void saves: {len(void)}; complete checkpoints after: {complete}")

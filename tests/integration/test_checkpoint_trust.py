"""A job loads only checkpoints that are its own and are data: a planted DCP index, or a job record that changed
while the job ran, stops the job with reason CheckpointRefused before anything of the checkpoint is read."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from kuberl.controller.driver import Driver
from kuberl.library import CheckpointUntrusted
from kuberl.resilience import checkpoint, identity
from kuberl.spec.contract import Reason
from kuberl.workers.groups import LocalWorkerGroup

from ..unit.test_dcp_reader import Payload
from .conftest import load_example


def driver_for(out: Path, steps: int) -> Driver:
    spec = load_example("quickstart.yaml", **{"trainer.steps": steps, "trainer.checkpoint.interval": 2}).spec
    return Driver(spec, "trust", out, lambda role: LocalWorkerGroup(role, spec, "cpu"), progress=False)


def trained(out: Path) -> Path:
    """Two steps of the quickstart with a checkpoint at step 2, in process; its checkpoint root."""
    driver = driver_for(out, 2)
    driver.start()
    try:
        driver.run()
    finally:
        driver.shutdown()
    assert checkpoint.latest(driver.ckpt_root) == 2
    return driver.ckpt_root


def test_a_planted_dcp_index_stops_the_resume_and_never_runs(netns, tmp_path: Path) -> None:
    root = trained(tmp_path)
    marker = tmp_path / "ran"
    (checkpoint.step_dir(root, 2) / "critic" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    driver = driver_for(tmp_path, 4)
    try:
        with pytest.raises(CheckpointUntrusted, match=r"critic/\.metadata refers to posix\.system") as err:
            driver.start()
    finally:
        driver.shutdown()
    assert err.value.reason == Reason.CHECKPOINT_REFUSED and not marker.exists()


def test_a_job_record_changed_while_the_job_runs_stops_any_load(netns, tmp_path: Path) -> None:
    root = trained(tmp_path)
    driver = driver_for(tmp_path, 4)
    try:
        driver.start()  # resumes from step 2: the record (none) is what it was when the roles started
        identity.Identity.of("someone-else", driver.spec).write(root)
        with pytest.raises(CheckpointUntrusted, match="job.json changed while job 'trust' ran"):
            driver.roles.load_checkpoint(2)
    finally:
        driver.shutdown()

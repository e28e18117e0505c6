"""The driver's artefacts on Kubernetes, run for real on CPU: with a checkpoint volume the operator points the
driver's --out at <checkpoint path>/runs/<job>, beside the checkpoints; the run and a restarted driver work there."""

from __future__ import annotations

from pathlib import Path

import yaml

from kuberl.metrics import read_jsonl
from kuberl.resilience import checkpoint
from kuberl.run import run_job
from kuberl.spec import validate_manifest
from kuberl_operator import builders, names

from .conftest import load_example


def test_artefacts_and_checkpoints_share_the_volume_and_survive_a_driver_restart(netns, tmp_path: Path):
    volume = tmp_path / "pvc"  # stands for the PVC, mounted at the checkpoint path
    raw = load_example("quickstart.yaml", **{"trainer.steps": 1, "trainer.checkpoint.interval": 1,
                                             "trainer.checkpoint.volumeClaim": "ckpt",
                                             "trainer.checkpoint.path": str(volume)})
    raw_spec = raw.model_dump(by_alias=True, exclude_none=True)["spec"]
    opts = builders.BuildOptions(namespace="ml")
    (cm,) = [o for o in builders.all_objects(raw, raw_spec, "t", opts) if o["metadata"]["name"].endswith("-spec")]
    job = validate_manifest(yaml.safe_load(cm["data"][names.SPEC_FILE]))  # what the driver reads
    out = Path(builders.driver_out(job))
    assert out == volume / "runs" / job.metadata.name

    run_job(job, out, backend="local", progress=False)
    assert (out / "reward_curve.png").stat().st_size > 0
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1]
    assert checkpoint.latest(volume) == 1  # runs/ beside step_* does not disturb the checkpoints

    # A new driver pod (same volume, same --out) resumes and continues the same metrics.jsonl.
    longer = job.model_copy(update={"spec": job.spec.model_copy(update={"trainer": job.spec.trainer.model_copy(
        update={"steps": 2})})})
    run_job(longer, out, backend="local", progress=False)
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    assert checkpoint.latest(volume) == 2

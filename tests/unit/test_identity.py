"""Job identity: the trained fields, their hash, and when a resume is refused (kuberl.resilience.identity)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kuberl.resilience import checkpoint
from kuberl.resilience.identity import Identity, clear, resume_problem, trained_fields
from kuberl.spec import validate_manifest


def spec(**changes):
    base = {"data": {"task": "repeat-letter"}, "reward": {"function": "kuberl.rewards.builtin:repeat_letter"}}
    for section, values in changes.items():
        base.setdefault(section, {}).update(values)
    return validate_manifest({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "spec": base}).spec


def test_only_fields_that_change_training_are_hashed() -> None:
    a = Identity.of("j", spec())
    for same in (
        {
            "trainer": {
                "steps": 999,
                "microBatchSize": 4,
                "checkpoint": {"interval": 3},
                "metrics": {"prometheusPort": 9},
            }
        },
        {"resilience": {"faults": [{"role": "critic", "step": 1}]}},
        {"roles": {"critic": {"replicas": 2}}},
        {"rollout": {"engine": "hf", "compile": True}},
        {"tracking": {"tensorboard": False}},
        {"data": {"eval": {"interval": 2}}},
        {"model": {"gradientCheckpointing": True}},
    ):
        assert Identity.of("j", spec(**same)).fingerprint == a.fingerprint, same
    for other in (
        {"trainer": {"actorLr": 0.5}},
        {"trainer": {"seed": 1}},
        {"algorithm": {"kl": {"coef": 0.5}}},
        {"rollout": {"temperature": 0.5}},
        {"data": {"batchSize": 32}},
        {"model": {"dtype": "bfloat16"}},
        {"reward": {"function": "kuberl.rewards.builtin:gsm8k"}},
    ):
        assert Identity.of("j", spec(**other)).fingerprint != a.fingerprint, other
    assert "spec.algorithm.kl.coef" in trained_fields(spec()) and "spec.trainer.steps" not in trained_fields(spec())


def complete(root: Path, step: int) -> None:
    checkpoint.fresh_step_dir(root, step)
    checkpoint.write_state(root, step, {"step": step}, keep=5)


def test_resume_problems(tmp_path: Path) -> None:
    root, out = tmp_path / "out" / "checkpoints", tmp_path / "out"
    mine = Identity.of("qs", spec())
    assert resume_problem(root, out, mine) is None  # a new folder
    mine.write(root)
    complete(root, 2)
    assert resume_problem(root, out, mine) is None  # the same job: resume
    other = resume_problem(root, out, Identity.of("grpo", spec()))
    assert (
        other.startswith(f"{root} holds the checkpoints of job 'qs' (up to step 2), not of 'grpo'")
        and "--restart" in other
    )
    changed = resume_problem(root, out, Identity.of("qs", spec(trainer={"actorLr": 0.5})))
    assert "trained with other settings: spec.trainer.actorLr 0.001 -> 0.5" in changed
    (root / "job.json").unlink()
    assert "without a job record" in resume_problem(root, out, mine)
    clear(root, out)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    assert "holds the metrics.jsonl of an earlier run" in resume_problem(root, out, mine)


def test_restart_removes_only_the_runs_own_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    root = out / "checkpoints"
    Identity.of("qs", spec()).write(root)
    complete(root, 2)
    for name in ("metrics.jsonl", "reward_curve.png", "notes.txt"):
        (out / name).write_text("x")
    (out / "model").mkdir()
    gone = clear(root, out)
    assert len(gone) == 5 and sorted(p.name for p in out.iterdir()) == ["checkpoints", "notes.txt"]
    assert list(root.iterdir()) == []


def test_an_interrupted_save_is_replaced(tmp_path: Path, capsys) -> None:
    stale = checkpoint.step_dir(tmp_path, 4) / "actor"
    stale.mkdir(parents=True)
    (stale / ".metadata").write_text("old")
    d = checkpoint.fresh_step_dir(tmp_path, 4)
    assert list(d.iterdir()) == [] and "interrupted save" in capsys.readouterr().out


def test_the_run_commands_checks_import_no_torch() -> None:
    """`kuberl run` refuses a bad job in about a second: its checks (manifest, output folder, checkpoints'
    owner) import neither torch nor Ray."""
    code = ("import sys, kuberl.run, kuberl.resilience.identity, kuberl.resilience.checkpoint, kuberl.preflight; "
            "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_local_ray_that_does_not_start_is_one_line(monkeypatch) -> None:
    """Ray's own start-up timeout (seen on an overloaded CI host) becomes kuberl's one-line error (exit 4)."""
    import pytest

    from kuberl.run import LocalRayFailed, quiet_local_ray, start_local_ray

    quiet_local_ray()  # before ray is imported (its auth mode is read then), as the Ray tests' session does
    import ray

    def timed_out(**_):
        raise Exception("The current node timed out during startup. This could happen because ...\nmore")

    monkeypatch.setattr(ray, "init", timed_out)
    with pytest.raises(LocalRayFailed) as failed:
        start_local_ray(spec())
    text = str(failed.value)
    assert "\n" not in text and text.startswith("a local Ray could not start: The current node timed out")
    assert "fix:" in text

"""Tracking sinks: the scalars they get, and MLflow for real (a file store in tmp_path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kuberl.metrics.tracking import MLflowTracker, make_trackers, scalars
from kuberl.spec import validate_manifest


def spec(tracking: dict):
    return validate_manifest(
        {
            "apiVersion": "kuberl.io/v1alpha1",
            "kind": "RLTrainingJob",
            "spec": {
                "data": {"task": "repeat-letter"},
                "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
                "tracking": tracking,
            },
        }
    ).spec


def test_scalars_are_the_finite_numbers() -> None:
    rec = {"step": 3, "reward_mean": 0.5, "kl": float("nan"), "worst_link_actor": "NV1", "flag": True, "n_params": 10}
    assert scalars(rec) == {"step": 3.0, "reward_mean": 0.5, "n_params": 10.0}


def test_tensorboard_is_on_by_default_and_can_be_turned_off(tmp_path: Path) -> None:
    trackers = make_trackers(spec({}), tmp_path, "j", 0)
    assert [type(t).__name__ for t in trackers] == ["TensorBoardTracker"]
    trackers[0].log({"step": 1, "reward_mean": 0.25})
    trackers[0].close()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert make_trackers(spec({"tensorboard": False}), tmp_path, "j", 0) == []


def test_mlflow_gets_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a file store: no server, no database
    uri = f"file:{tmp_path / 'mlruns'}"
    tracker = MLflowTracker(spec({"tensorboard": False, "mlflow": {"trackingUri": uri, "experiment": "exp"}}), "job-1")
    for step, value in ((1, 0.25), (2, 0.5)):
        tracker.log({"step": step, "reward_mean": value, "worst_link_actor": "NV1"})
    tracker.close()
    client = mlflow.tracking.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert run.info.run_name == "job-1"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward_mean")] == [
        (1, 0.25),
        (2, 0.5),
    ]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's own OSError
def test_tensorboard_whose_writer_thread_ended_raises_and_opens_a_new_event_file(tmp_path: Path) -> None:
    """tensorboardX's writer thread ends at its first failed write (a full disk): the tracker says so with an
    OSError instead of blocking training on the thread's full queue, and the next step writes a new file."""
    import time

    from kuberl.metrics.tracking import TensorBoardTracker

    tracker = TensorBoardTracker(tmp_path, start_step=0)
    tracker.log({"step": 1, "reward_mean": 0.1})
    worker = tracker.writer.file_writer.event_writer._worker

    def full(_event) -> None:
        raise OSError(28, "No space left on device")

    worker._record_writer.write_event = full
    tracker.log({"step": 2, "reward_mean": 0.2})
    deadline = time.monotonic() + 10
    while worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not worker.is_alive()
    with pytest.raises(OSError, match="stopped at a failed write"):
        tracker.log({"step": 3, "reward_mean": 0.3})
    time.sleep(1.1)  # tensorboardX names event files by the second
    tracker.log({"step": 4, "reward_mean": 0.4})
    tracker.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2

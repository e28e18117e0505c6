"""Experiment tracking: the scalars of each metrics.jsonl record, also in TensorBoard, MLflow or W&B.

- TensorBoard (`spec.tracking.tensorboard`, on by default): event files under `<out>/tensorboard`,
  written with tensorboardX (`tensorboard --logdir <out>/tensorboard`). A resumed run purges the events
  past its restored step, as metrics.jsonl drops those records.
- MLflow (`spec.tracking.mlflow`) and W&B (`spec.tracking.wandb`), when asked for and installed (the
  preflight refuses a job that asks for a package that is missing).

Every tracker gets the same scalars: the record's finite numbers, keyed as in metrics.jsonl, at its step.
Trackers are `kuberl.metrics` step writers (`write(rec)`, `close()`), added to the driver's sink.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from kuberl.metrics.record import StepRecord
from kuberl.spec import JobSpec


class Tracker:
    """A step writer logging the scalars of each step's metrics.jsonl object (`log`)."""

    def write(self, rec: StepRecord) -> None:
        self.log(rec.flat())

    def log(self, record: dict[str, Any]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's finite numeric values (booleans and strings left out), `step` too."""
    return {
        k: float(v)
        for k, v in record.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


class TensorBoardTracker(Tracker):
    """tensorboardX writes from a thread of its own, which ends at its first failed write (a full disk); its queue
    then fills and every later add would block training. So the queue is long enough for many steps, a tracker
    whose thread has ended raises OSError (the sink warns once, training goes on), and the next step starts a new
    event file in the same folder, which TensorBoard reads beside the old one."""

    QUEUE = 100_000  # events: far more than one step's scalars, so a step never blocks on a thread that just ended

    def __init__(self, logdir: Path, start_step: int):
        self.logdir, self.purge = logdir, start_step + 1 if start_step else None
        self.writer = None
        self._open()

    def _open(self) -> None:
        from tensorboardX import SummaryWriter

        # purge_step: TensorBoard drops events of an earlier run from this step on (a resume replays them)
        self.writer = SummaryWriter(logdir=str(self.logdir), purge_step=self.purge, max_queue=self.QUEUE)
        self.purge = None

    def _alive(self) -> bool:
        worker = getattr(getattr(self.writer.file_writer, "event_writer", None), "_worker", None)
        return worker is None or worker.is_alive()

    def log(self, record: dict[str, Any]) -> None:
        if self.writer is None:
            self._open()
        elif not self._alive():
            self.writer = None  # not closed: its flush would fail the same way
            raise OSError(f"TensorBoard's event writer under {self.logdir} stopped at a failed write")
        step = int(record["step"])
        for key, value in scalars(record).items():
            if key != "step":
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None and self._alive():
            self.writer.close()


class MLflowTracker(Tracker):
    def __init__(self, spec: JobSpec, job: str):
        import mlflow

        cfg = spec.tracking.mlflow
        if cfg.tracking_uri:
            mlflow.set_tracking_uri(cfg.tracking_uri)
        mlflow.set_experiment(cfg.experiment or job)
        self.mlflow = mlflow
        self.run = mlflow.start_run(run_name=job)

    def log(self, record: dict[str, Any]) -> None:
        values = scalars(record)
        self.mlflow.log_metrics({k: v for k, v in values.items() if k != "step"}, step=int(record["step"]))

    def close(self) -> None:
        self.mlflow.end_run()


class WandbTracker(Tracker):
    def __init__(self, spec: JobSpec, out: Path, job: str):
        import wandb

        cfg = spec.tracking.wandb
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            name=job,
            mode=cfg.mode,
            dir=str(out),
            config=spec.model_dump(by_alias=True, mode="json", exclude_none=True),
        )

    def log(self, record: dict[str, Any]) -> None:
        values = scalars(record)
        self.run.log({k: v for k, v in values.items() if k != "step"}, step=int(record["step"]))

    def close(self) -> None:
        self.run.finish()


def make_trackers(spec: JobSpec, out: Path, job: str, start_step: int) -> list[Tracker]:
    """The trackers the spec asks for; `start_step` is the step a resumed run restored."""
    cfg = spec.tracking
    out_list: list[Tracker] = []
    if cfg.tensorboard:
        out_list.append(TensorBoardTracker(out / "tensorboard", start_step))
    if cfg.mlflow is not None:
        out_list.append(MLflowTracker(spec, job))
    if cfg.wandb is not None:
        out_list.append(WandbTracker(spec, out, job))
    return out_list

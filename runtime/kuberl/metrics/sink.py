"""`MetricsSink`: every per-step writer behind one `log(record)`; more can be added with `add`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from kuberl import logs
from kuberl.metrics.record import StepRecord

from .console import Console
from .jsonl import JsonlWriter
from .prometheus import serve

log = logs.get("metrics")


class StepWriter(Protocol):
    """Something that takes each step's record (a TensorBoard writer, say)."""

    def write(self, rec: StepRecord) -> None: ...

    def close(self) -> None: ...


class MetricsSink:
    def __init__(self, out_dir: Path, job: str, total_steps: int, start_step: int = 0, progress: bool = True,
                 prometheus_port: int | None = None, prometheus_address: str = "127.0.0.1"):
        self.path = out_dir / "metrics.jsonl"
        self.prometheus = serve(job, prometheus_port, prometheus_address)
        self.port: int | None = self.prometheus.port if self.prometheus is not None else None
        writers: list[StepWriter | None] = [JsonlWriter(self.path, start_step), self.prometheus,
                                               Console(job, total_steps, start_step, progress)]
        self.writers: list[StepWriter] = [w for w in writers if w is not None]
        self.failing: set[int] = set()  # id() of the writers whose last write failed (warned once per streak)

    @property
    def registry(self):
        """The Prometheus registry served (None without a port)."""
        return self.prometheus.registry if self.prometheus is not None else None

    def add(self, writer: StepWriter) -> None:
        """One more writer for every following step (closed with the sink)."""
        self.writers.append(writer)

    def log(self, rec: StepRecord) -> None:
        for writer in self.writers:
            self._guarded(writer, lambda w: w.write(rec), f"step {rec.step}")

    def close(self) -> None:
        for writer in self.writers:
            self._guarded(writer, lambda w: w.close(), "its last steps")

    def _guarded(self, writer: StepWriter, call: Callable[[StepWriter], None], what: str) -> None:
        """A writer that cannot write (a full disk, a tracking server down) costs its own record, with one
        warning until it writes again; it never stops training."""
        try:
            call(writer)
        except OSError as exc:
            if id(writer) not in self.failing:
                log.warning(f"{type(writer).__name__} could not write {what} ({exc.strerror or exc}); training goes on")
            self.failing.add(id(writer))
            return
        self.failing.discard(id(writer))

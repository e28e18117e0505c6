"""`metrics.jsonl`: one JSON object per step (`StepRecord.flat()`), continuous across resumes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kuberl import logs
from kuberl.metrics.record import StepRecord

log = logs.get("metrics")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The file's records. A line that is not a whole JSON object (the last one torn by a crash mid-write)
    is dropped, with a warning on stderr naming the file and line."""
    if not path.exists():
        return []
    rows = []
    for n, line in enumerate(path.read_bytes().decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            log.warning(f"{path}:{n}: dropped a line that is not a whole JSON record (a write cut short by a crash)")
            continue
        rows.append(row)
    return rows


def append_whole(path: Path, data: bytes) -> None:
    """Append `data` to `path` whole or not at all: a write cut short (a full disk) is taken back before the
    error is raised, so the file never ends in a torn line."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def last_step(path: Path) -> int:
    """The newest step the file records (0: none, or no file)."""
    return max((r.get("step", 0) for r in read_jsonl(path)), default=0)


class JsonlWriter:
    def __init__(self, path: Path, start_step: int = 0):
        """On resume (`start_step` > 0) keep one continuous file: records past the restored step go."""
        self.path = path
        self.waiting: list[str] = []  # lines a full disk refused, written before the next step's
        kept = [r for r in read_jsonl(path) if r.get("step", 0) <= start_step]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def write(self, rec: StepRecord) -> None:
        """Append the step's line. A disk with no room keeps it (and any before it) in memory, with one warning,
        until a later step finds room: training goes on and no row is lost while the driver lives."""
        self.waiting.append(json.dumps(rec.flat()) + "\n")
        try:
            append_whole(self.path, "".join(self.waiting).encode())
        except OSError as exc:
            if len(self.waiting) == 1:
                log.warning(f"{self.path}: {exc.strerror}: the metrics of step {rec.step} on are kept in memory until "
                            f"there is room again", extra={"step": rec.step})
            return
        self.waiting.clear()

    def close(self) -> None:
        """Nothing held open between steps; lines still waiting for room are tried once more."""
        if self.waiting:
            try:
                append_whole(self.path, "".join(self.waiting).encode())
                self.waiting.clear()
            except OSError as exc:
                log.warning(f"{self.path}: {exc.strerror}: the metrics of the last {len(self.waiting)} steps could "
                            f"not be written")

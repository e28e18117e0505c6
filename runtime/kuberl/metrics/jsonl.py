"""`metrics.jsonl`: one JSON object per step (`StepRecord.flat()`), continuous across resumes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..record import StepRecord


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
            print(f"warning: {path}:{n}: dropped a line that is not a whole JSON record (a write cut short by "
                  f"a crash)", file=sys.stderr, flush=True)
            continue
        rows.append(row)
    return rows


class JsonlWriter:
    def __init__(self, path: Path, start_step: int = 0):
        """On resume (`start_step` > 0) keep one continuous file: records past the restored step go."""
        self.path = path
        kept = [r for r in read_jsonl(path) if r.get("step", 0) <= start_step]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def write(self, rec: StepRecord) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(rec.flat()) + "\n")

    def close(self) -> None:
        """Nothing held open between steps."""

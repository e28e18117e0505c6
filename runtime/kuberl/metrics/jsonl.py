"""`metrics.jsonl`: one JSON object per step (`StepRecord.flat()`), continuous across resumes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..record import StepRecord


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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

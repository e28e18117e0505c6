"""Prompt sources: built-in tasks generated locally, or jsonl/parquet files.

A `PromptLoader` yields batches of `{"prompt": str, "answer": str | None}` in a seeded order, and
its position (`epoch`, `index`) is saved in checkpoints so a resumed run sees the same data.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .spec.model import DataSpec

LETTERS = "abcdef"


def repeat_letter_task(n: int = 512, seed: int = 1234) -> list[dict[str, str]]:
    """'say c:' -> the response should repeat the letter ('ccccc...'); reward = share of that letter."""
    rng = random.Random(seed)
    return [{"prompt": f"say {c}:", "answer": c} for c in (rng.choice(LETTERS) for _ in range(n))]


def gsm8k_toy_task(n: int = 512, seed: int = 1234) -> list[dict[str, str]]:
    """'3+4=' with answer '7': graded by the GSM8K-style `#### <answer>` matcher."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return rows


BUILTIN_TASKS = {"repeat-letter": repeat_letter_task, "gsm8k-toy": gsm8k_toy_task}


class DataError(ValueError):
    """A dataset problem, with the spec field to fix."""


def read_rows(path: str, field: str) -> list[dict[str, Any]]:
    """Rows of a .jsonl or .parquet file; DataError names `field` and the fix."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{field}: file {path!r} does not exist (fix: check the path; in Kubernetes mount it into the pods)")
    if p.suffix == ".jsonl":
        rows = []
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if line.strip():
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{field}: {path} line {i} is not JSON ({exc.msg}) (fix: one JSON object per line)") from None
                if not isinstance(obj, dict):
                    raise DataError(f"{field}: {path} line {i} is a JSON {type(obj).__name__}, not an object (fix: one JSON object per line)")
                rows.append(obj)
        return rows
    import pyarrow.parquet as pq

    try:
        return pq.read_table(p).to_pylist()
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise DataError(f"{field}: {path} is not a readable parquet file ({exc}) (fix: rewrite it with pyarrow/pandas)") from None


def load_rows(data: DataSpec) -> list[dict[str, Any]]:
    """All prompt rows for a data spec, normalised to {'prompt', 'answer'}."""
    if data.task:
        return BUILTIN_TASKS[data.task]()
    rows: list[dict[str, Any]] = []
    for i, path in enumerate(data.files):
        for row in read_rows(path, f"spec.data.files[{i}]"):
            if data.prompt_key not in row:
                raise DataError(f"spec.data.promptKey: {path} has no field {data.prompt_key!r} (fields: {sorted(row)}) (fix: set spec.data.promptKey)")
            answer = row.get(data.answer_key)
            rows.append({"prompt": str(row[data.prompt_key]), "answer": None if answer is None else str(answer)})
    if not rows:
        raise DataError("spec.data.files: the files hold no rows (fix: give non-empty files)")
    return rows


@dataclass
class PromptLoader:
    """Seeded, resumable iteration over prompt rows in batches of `batch_size`."""

    rows: list[dict[str, Any]]
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    epoch: int = 0
    index: int = 0

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next_batch(self) -> list[dict[str, Any]]:
        out = []
        while len(out) < self.batch_size:
            order = self._order(self.epoch)
            if self.index >= len(order):
                self.epoch, self.index = self.epoch + 1, 0
                continue
            out.append(self.rows[order[self.index]])
            self.index += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
